"""transduce's kernels for decoding steps (transduce.model.kernels, csrc/decoding.cpp) against PyTorch's
scaled_dot_product_attention, and the fallback when it cannot be built."""

import warnings

import pytest
import torch
import torch.nn.functional as F

from transduce import ModelConfig, Transformer, fastpaths
from transduce.model import kernels

pytestmark = pytest.mark.skipif(not fastpaths.settings.kernels, reason="TRANSDUCE_KERNELS=0: the kernel is turned off")


def reference(q, k, v, mask=None):
    """What the kernel computes, by PyTorch: (N, G, H, D)."""
    attn_mask = None if mask is None else mask[:, None, None, :]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask).transpose(1, 2)


def test_the_kernel_builds():
    """CI has a compiler: the kernel must build there, or every decoding test below would test the fallback."""
    assert kernels.compiled() is not None
    assert kernels.applies(torch.zeros(1))
    assert not kernels.applies(torch.zeros(1, dtype=torch.bfloat16))


@pytest.mark.parametrize(
    "n, heads, queries, keys, d",
    [(6, 4, 1, 9, 32), (3, 2, 4, 11, 64), (5, 3, 2, 1, 16), (2, 2, 3, 300, 128), (4, 1, 5, 7, 10),
     (2, 3, 2, 2, 32), (3, 2, 3, 8, 64), (2, 2, 1, 1, 32)],
)  # fmt: skip
@pytest.mark.parametrize("masked", [False, True])
def test_kernel_equals_scaled_dot_product_attention(n, heads, queries, keys, d, masked):
    """Head sizes compiled in (32, 64, 128; with AVX-512, 32 and 64 by four keys at a time) and not (16, 10); one
    key, fewer than four, multiples of four and not; with and without a mask."""
    g = torch.Generator().manual_seed(n * keys + d)
    q, k, v = (torch.randn(n, heads, t, d, generator=g) * 2 for t in (queries, keys, keys))
    mask = None
    if masked:
        mask = torch.rand(n, keys, generator=g) > 0.4
        mask[:, 0] = True  # every query has a key to attend
    out = kernels.attend(q, k, v, mask)
    assert out.shape == (n, queries, heads, d) and out.is_contiguous()
    # (values up to about 8 in size, summed in another order than SDPA's: a few units in the last place of them)
    torch.testing.assert_close(out, reference(q, k, v, mask), atol=1e-5, rtol=1e-5)


def test_kernel_reads_strided_views_as_the_decoding_step_passes_them():
    """Queries as a strided view of a fused projection, keys and values as slices of the stacked cache, the mask as
    a view of a (N, 1, 1, T) mask: the kernel reads them through their strides, no copies."""
    g = torch.Generator().manual_seed(0)
    rows, heads, d, t = 6, 4, 8, 5
    qkv = torch.randn(rows, 3, heads, d, generator=g)
    s_row, _, s_head, s_dim = qkv.stride()
    q = qkv.as_strided((rows, heads, 1, d), (s_row, s_head, s_head, s_dim))
    cache = torch.randn(2, 2, rows, heads, t + 3, d, generator=g).narrow(4, 0, t)  # (layers, k/v, ...) with room
    k, v = cache[1].unbind(0)
    assert not k.is_contiguous()
    mask4 = torch.rand(rows, 1, 1, t, generator=g) > 0.3
    mask4[..., -1] = True
    out = kernels.attend(q, k, v, mask4[:, 0, 0])
    expected = reference(q.contiguous(), k.contiguous(), v.contiguous(), mask4[:, 0, 0].contiguous())
    torch.testing.assert_close(out, expected, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("d", [32, 12])
def test_attention_by_table_equals_attention_over_the_gathered_cache(d):
    """The self-attention of a step over a cache stored by position: row b reads position t from slab row
    table[b, t]; the same as attending over the keys and values gathered row by row."""
    g = torch.Generator().manual_seed(d)
    rows, heads, positions, capacity, slab_rows = 5, 3, 6, 8, 7
    storage = torch.randn(2, capacity, slab_rows, heads, d, generator=g)
    table = torch.randint(0, slab_rows, (rows, positions), generator=g)
    q = torch.randn(rows, heads, 1, d, generator=g)
    k, v = storage.unbind(0)
    out = kernels.compiled().attend_by_table(q, k, v, table, d**-0.5)
    at = torch.arange(positions)[None, :]
    gathered_k, gathered_v = (x[at, table].transpose(1, 2) for x in (k, v))  # (rows, heads, positions, d)
    torch.testing.assert_close(out, reference(q, gathered_k, gathered_v), atol=2e-6, rtol=1e-5)
    with pytest.raises(RuntimeError, match="table entry 7 outside the 7 rows"):
        kernels.compiled().attend_by_table(q, k, v, table.clamp(max=6).index_fill(1, torch.tensor([2]), 7), 1.0)


@pytest.mark.parametrize("d", [4, 32])
def test_masked_keys_get_no_weight_and_a_query_with_no_key_gets_zeros(d):
    q = torch.ones(1, 1, 2, d)
    k = torch.zeros(2, 1, 3, d)[:1]
    v = torch.tensor([[[[1.0] * d, [2.0] * d, [1e30] * d]]])  # a huge value on the masked key would show
    out = kernels.attend(q, k, v, torch.tensor([[True, True, False]]))
    assert torch.equal(out, torch.full((1, 2, 1, d), 1.5))  # equal scores: the mean of the two keys, exactly
    none = kernels.attend(q, k, v, torch.tensor([[False, False, False]]))
    assert torch.equal(none, torch.zeros(1, 2, 1, d))


def test_kernel_rejects_what_it_cannot_read():
    q = torch.randn(2, 1, 1, 4)
    with pytest.raises(RuntimeError, match="float32 tensors only"):
        kernels.attend(q.double(), q.double(), q.double())
    with pytest.raises(RuntimeError, match="the last dimension must be dense"):
        strided = torch.randn(2, 1, 4, 3).transpose(2, 3)  # (2, 1, 3, 4), stride 3 along the last dimension
        kernels.attend(q, strided, strided)
    with pytest.raises(RuntimeError, match="do not match"):
        kernels.attend(q, torch.randn(2, 1, 3, 5), torch.randn(2, 1, 3, 5))
    with pytest.raises(RuntimeError, match=r"the mask must be \(N, T\) bool"):
        kernels.attend(q, q, q, torch.ones(2, 1))
    with pytest.raises(RuntimeError, match="the mask must be on the CPU"):  # (meta: a device that is not the CPU)
        kernels.attend(q, q, q, torch.ones(2, 1, dtype=torch.bool, device="meta"))
    storage = torch.randn(1, 2, 1, 4)  # (positions, rows, h, d)
    with pytest.raises(RuntimeError, match="the table must be on the CPU"):
        kernels.compiled().attend_by_table(q, storage, storage, torch.zeros(2, 1, dtype=torch.long, device="meta"), 1.0)
    with pytest.raises(RuntimeError, match="table entry 2 outside the 2 rows"):
        kernels.compiled().attend_by_table(q, storage, storage, torch.tensor([[0], [2]]), 1.0)


def test_when_the_kernel_cannot_be_built_decoding_warns_once_and_uses_pytorchs_attention(monkeypatch):
    torch.manual_seed(0)
    model = Transformer(ModelConfig.preset("test", src_vocab_size=20, tgt_vocab_size=20)).eval()
    src = torch.randint(4, 20, (2, 5))
    tgt = torch.randint(4, 20, (2, 3))

    def steps():
        with torch.inference_mode():
            memory = model.encode(src)
            cache = model.init_cache(memory)
            out = []
            for i in range(tgt.shape[1]):
                logits, cache = model.decode(tgt[:, i : i + 1], memory, cache)
                out.append(logits)
        return torch.cat(out, dim=1)

    with_kernel = steps()

    def no_compiler():
        raise OSError("no C++ compiler")

    monkeypatch.setattr(kernels, "_state", {"module": None, "error": None})
    monkeypatch.setattr(kernels, "build", no_compiler)
    with pytest.warns(RuntimeWarning, match=r"could not build the CPU kernels \(OSError: no C\+\+ compiler\)"):
        without = steps()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process, not once per step
        steps()
    assert kernels.compiled() is None
    torch.testing.assert_close(without, with_kernel, atol=1e-5, rtol=1e-5)
    with pytest.raises(RuntimeError, match="CPU kernels are not available"):
        kernels.attend(torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 1, 4))


def test_compiling_the_kernels_is_announced_and_loading_them_from_the_cache_is_not(monkeypatch, tmp_path, caplog):
    import logging
    import time

    from torch.utils import cpp_extension

    notice = "compiling transduce's CPU kernels (first use, about 30-40 s; then cached)"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(kernels, "COMPILE_NOTICE_S", 0.3)
    load_s = {"s": 0.0}
    monkeypatch.setattr(cpp_extension, "load", lambda **kw: time.sleep(load_s["s"]) or kw["name"])
    name = kernels.extension_name()
    with caplog.at_level(logging.INFO, logger="transduce.model.kernels"):
        assert kernels.build() == name  # nothing built yet: said at once
        assert caplog.messages == [notice]
        caplog.clear()
        (tmp_path / name / f"{name}.so").write_bytes(b"")
        assert kernels.build() == name  # built: loaded without a word
        assert caplog.messages == []
        load_s["s"] = 1.0  # built, but compiled again (changed sources): said once the loading takes long
        assert kernels.build() == name
        assert caplog.messages == [notice]


@pytest.mark.parametrize("vocab", [8000, 37, 16, 5])
def test_logsumexp_and_row_topk_equal_torchs(vocab):
    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(6, vocab, generator=g) * 5
    x[1] = float("-inf")  # a row with one allowed token
    x[1, vocab // 2] = 0.25
    x[2, : vocab // 2] = float("-inf")
    x[3] = float("-inf")  # nothing allowed at all
    normaliser = kernels.logsumexp(x)
    torch.testing.assert_close(normaliser, torch.logsumexp(x, dim=1), atol=1e-5, rtol=1e-6)
    for k in sorted({1, min(8, vocab), vocab}):
        values, indices = kernels.row_topk(x, k)
        want, _ = x.topk(k, dim=1)
        assert torch.equal(values, want)
        assert torch.equal(x.gather(1, indices), values)  # each index points at its value
        assert all(len(set(row)) == k for row in indices.tolist())  # no index twice, even among the -inf ones


@pytest.mark.parametrize("vocab", [8000, 37, 16, 5])
def test_row_candidates_is_logsumexp_then_masking_then_row_topk(vocab):
    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(7, vocab, generator=g) * 5
    x[1] = float("-inf")
    x[1, vocab // 2] = 0.25
    x[3] = float("-inf")
    x[4, 1] = 100.0  # the largest value of its row, then excluded
    excluded = torch.tensor([0, 1, vocab - 1])
    k = min(8, vocab)
    want_normaliser = torch.logsumexp(x, dim=1)
    masked = x.clone()
    masked[:, excluded] = float("-inf")
    want_values, _ = masked.topk(k, dim=1)
    got = x.clone()
    normaliser, values, indices = kernels.row_candidates(got, k, excluded)
    torch.testing.assert_close(normaliser, want_normaliser, atol=1e-5, rtol=1e-6)
    assert torch.equal(got, masked)  # the excluded ids are -inf in place, as the search's masks would leave them
    assert torch.equal(values, want_values) and torch.equal(masked.gather(1, indices), values)
    assert indices[4, 0].item() != 1 and values[4, 0].item() < 100.0  # the excluded largest value is not first
    nothing = x.clone()
    assert torch.equal(kernels.row_candidates(nothing, k, torch.tensor([], dtype=torch.long))[1], x.topk(k)[0])
    with pytest.raises(RuntimeError, match=f"excluded id {vocab} is out of range for V={vocab}"):
        kernels.row_candidates(x.clone(), k, torch.tensor([vocab]))
    with pytest.raises(RuntimeError, match="excluded must be a 1-D int64 CPU tensor"):
        kernels.row_candidates(x.clone(), k, torch.tensor([0.0]))


@pytest.mark.parametrize("past_len, use_order", [(0, False), (5, True), (5, False), (1, True)])
@pytest.mark.parametrize("d", [32, 10])
def test_attend_gathered_copies_the_cache_in_order_and_attends_over_it(past_len, use_order, d):
    """The cache of the next step (past's rows in the new order, then the new keys and values) and the attention
    over it, as torch.index_select, a copy and scaled_dot_product_attention give them."""
    g = torch.Generator().manual_seed(past_len * 7 + d)
    rows, heads, batch = 5, 3, 4
    past = torch.randn(2, rows, heads, past_len, d, generator=g)
    order = torch.tensor([4, 0, 0, 2]) if use_order else None
    if not use_order:
        past = past[:, :batch].contiguous()
    qkv = torch.randn(batch, 3, heads, d, generator=g)  # as the step's QKV product: new_kv is a strided view
    new_kv = qkv.narrow(1, 1, 2).transpose(0, 1)
    q = qkv[:, 0, :, None]
    out = torch.empty(2, batch, heads, past_len + 1, d)
    got = kernels.compiled().attend_gathered(q, past if past_len else None, order, new_kv, out, d**-0.5)
    want_cache = torch.cat([past if order is None else past.index_select(1, order), new_kv[:, :, :, None]], dim=3)
    assert torch.equal(out, want_cache)
    torch.testing.assert_close(got, reference(q, want_cache[0], want_cache[1]), atol=1e-5, rtol=1e-5)


def test_attend_gathered_names_what_is_wrong():
    module = kernels.compiled()
    q, new_kv = torch.zeros(2, 1, 1, 4), torch.zeros(2, 2, 1, 4)
    past, out = torch.zeros(2, 3, 1, 2, 4), torch.zeros(2, 2, 1, 3, 4)
    with pytest.raises(RuntimeError, match="attend_gathered: order entry 3 outside the 3 rows"):
        module.attend_gathered(q, past, torch.tensor([0, 3]), new_kv, out, 0.5)
    with pytest.raises(RuntimeError, match="without an order past needs 2 rows, got 3"):
        module.attend_gathered(q, past, None, new_kv, out, 0.5)
    with pytest.raises(RuntimeError, match="past is needed exactly when out holds earlier positions"):
        module.attend_gathered(q, None, None, new_kv, out, 0.5)
    with pytest.raises(RuntimeError, match=r"out must be a contiguous \(2, 2, 1, T \+ 1, 4\) tensor"):
        module.attend_gathered(q, past, torch.tensor([0, 1]), new_kv, torch.zeros(2, 2, 1, 5, 4)[:, :, :, :3], 0.5)


@pytest.mark.parametrize("dim", [128, 37])
def test_layer_norm_equals_torchs(dim):
    g = torch.Generator().manual_seed(dim)
    x = torch.randn(9, 2 * dim, generator=g)[:, :dim] * 3 + 1  # rows with a stride of their own
    weight, bias = torch.randn(dim, generator=g), torch.randn(dim, generator=g)
    module = kernels.compiled()
    for w, b in [(weight, bias), (weight, None), (None, None)]:
        want = torch.layer_norm(x, (dim,), w, b, 1e-5)
        torch.testing.assert_close(module.layer_norm(x, w, b, 1e-5), want, atol=2e-6, rtol=1e-5)


def test_layer_norm_names_what_is_wrong():
    module = kernels.compiled()
    with pytest.raises(RuntimeError, match=r"layer_norm: weight and bias must be contiguous float32 \(37,\)"):
        module.layer_norm(torch.zeros(2, 37), torch.ones(38), None, 1e-5)
    with pytest.raises(RuntimeError, match="layer_norm: x must be 2-D"):
        module.layer_norm(torch.zeros(2, 3, 37), None, None, 1e-5)


def test_row_topk_puts_the_smaller_index_first_among_equal_values():
    x = torch.tensor([[1.0, 3.0, 2.0, 3.0, 3.0, 0.0] * 4])
    values, indices = kernels.row_topk(x, 4)
    assert values.tolist() == [[3.0, 3.0, 3.0, 3.0]] and indices.tolist() == [[1, 3, 4, 7]]
    with pytest.raises(RuntimeError, match="need 1 <= k <= V, got k=25, V=24"):
        kernels.row_topk(x, 25)
    with pytest.raises(RuntimeError, match="dense rows"):
        kernels.logsumexp(x.t())


@pytest.mark.parametrize("vocab", [64, 13])  # NaN / +inf inside the vectorised blocks, and in the scalar tail only
def test_logsumexp_of_rows_with_nan_or_inf_is_torchs(vocab):
    x = torch.randn(4, vocab, generator=torch.Generator().manual_seed(1))
    x[0, vocab - 3] = float("nan")  # a NaN propagates, as through torch.logsumexp (a model gone wrong shows)
    x[1, 2] = float("nan")
    x[2, 5] = float("inf")
    got, want = kernels.logsumexp(x), torch.logsumexp(x, dim=1)
    assert got[:2].isnan().all() and want[:2].isnan().all()
    assert got[2].item() == want[2].item() == float("inf")
    torch.testing.assert_close(got[3], want[3])


def test_row_topk_orders_ties_within_a_vectorised_block_by_index():
    """Ties that arrive in the 16-wide blocks (past the first k values), not only in the scalar head and tail."""
    x = torch.zeros(2, 80)
    x[0, [20, 21, 35, 50, 51]] = 5.0  # five equal values past the head, k = 4: the four smallest indices
    x[1, [70, 18, 33]] = torch.tensor([7.0, 7.0, 6.0])
    values, indices = kernels.row_topk(x, 4)
    assert indices[0].tolist() == [20, 21, 35, 50] and values[0].tolist() == [5.0] * 4
    assert indices[1].tolist()[:3] == [18, 70, 33] and values[1].tolist()[:3] == [7.0, 7.0, 6.0]
    assert indices[1, 3].item() == 0  # then the zeros, the smallest index first


@pytest.mark.parametrize("autocast", [False, True])
def test_a_training_step_gives_the_same_loss_and_gradients_without_the_kernels(monkeypatch, autocast):
    """Dropout (the same masks from the same seed) and the loss through the kernels or through PyTorch's operations:
    one seeded training step of a model with dropout, in float32 and under bf16 autocast."""
    from transduce.training.loss import label_smoothed_nll

    torch.manual_seed(0)
    model = Transformer(ModelConfig.preset("test", src_vocab_size=50, tgt_vocab_size=50, dropout=0.3)).train()
    src, tgt = torch.randint(4, 50, (6, 9)), torch.randint(4, 50, (6, 8))
    src[0, 6:] = tgt[1, 5:] = 0

    def step():
        torch.manual_seed(1)
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(src, tgt[:, :-1])
        loss, _, n = label_smoothed_nll(logits, tgt[:, 1:], 0.1, 0)
        (loss / n).backward()
        return [loss.detach()] + [p.grad.clone() for p in model.parameters()]

    with_kernels = step()
    monkeypatch.setattr(kernels, "compiled", lambda: None)
    without = step()
    tol = dict(atol=2e-2, rtol=2e-2) if autocast else dict(atol=1e-6, rtol=1e-5)
    for a, b in zip(with_kernels, without):
        torch.testing.assert_close(a, b, **tol)


@pytest.mark.parametrize("dtype,p", [(torch.float32, 0.0), (torch.float32, 0.1), (torch.bfloat16, 0.3)])
def test_fused_residual_equals_dropout_add_and_layer_norm(monkeypatch, dtype, p):
    """``LayerNorm(x + dropout(y))`` of a post-norm layer in training, through the kernel and through PyTorch's
    operations with the same dropout seed: the same output and gradients (bf16: the reference rounds
    ``dropout(y)`` to bf16 before the add, the kernel adds in float32)."""
    import transduce.model.layers as layers

    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(40)
    torch.nn.init.normal_(norm.weight)
    torch.nn.init.normal_(norm.bias)
    res = layers._Residual(False, p).train()
    x = torch.randn(3, 37, 40, requires_grad=True)  # 111 rows: blocks of 16 straddle rows
    y = torch.randn(3, 37, 40).to(dtype).requires_grad_()
    upstream = torch.randn(3, 37, 40)
    results = []
    for fused in (True, False):
        monkeypatch.setattr(fastpaths.settings, "kernels", fused)
        for t in (x, y, norm.weight, norm.bias):
            t.grad = None
        torch.manual_seed(5)
        out = res.add(x, y, norm)
        assert (type(out.grad_fn).__name__ == "_AddLayerNormBackward") == fused
        out.backward(upstream)
        results.append((out.detach(), x.grad, y.grad, norm.weight.grad, norm.bias.grad))
    tol = dict(atol=5e-2, rtol=5e-2) if dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-5)
    for a, b in zip(*results):  # the weight and bias gradients sum 111 rows: bf16 differences add up
        assert a.dtype == b.dtype
        torch.testing.assert_close(a.float(), b.float(), **tol)
    if p > 0:  # the same mask: y's gradient is zero at the same places
        assert torch.equal(results[0][2] == 0, results[1][2] == 0)


def test_the_model_trains_post_norm_layers_through_the_fused_residual(monkeypatch):
    import transduce.model.fused as fused

    calls = []
    real = fused._AddLayerNorm.apply
    monkeypatch.setattr(fused._AddLayerNorm, "apply", lambda *a: calls.append(1) or real(*a))
    src, tgt = torch.randint(4, 50, (2, 7)), torch.randint(4, 50, (2, 6))
    for norm, expected in (("post", 2 * 2 + 3 * 2), ("pre", 0)):
        model = Transformer(ModelConfig.preset("test", src_vocab_size=50, tgt_vocab_size=50, norm=norm)).train()
        calls.clear()
        model(src, tgt).sum().backward()
        assert len(calls) == expected, norm
        calls.clear()
        with torch.no_grad():
            model.eval()(src, tgt)
        assert not calls  # inference: PyTorch's add and LayerNorm


def test_fused_residual_drops_an_infinite_value_as_dropout_does(monkeypatch):
    """A non-finite sublayer output at a dropped position is dropped (0), not multiplied into a NaN."""
    import transduce.model.layers as layers

    norm = torch.nn.LayerNorm(32)
    res = layers._Residual(False, 0.5).train()
    x, y = torch.randn(64, 32), torch.randn(64, 32)
    y[:, 3] = float("inf")
    outs = []
    for fused in (True, False):
        monkeypatch.setattr(fastpaths.settings, "kernels", fused)
        torch.manual_seed(8)
        with torch.no_grad():
            outs.append(res.add(x, y, norm))
    assert torch.equal(outs[0].isnan(), outs[1].isnan()) and 0 < int(outs[0].isnan().any(-1).sum()) < 64
    finite = ~outs[1].isnan()
    torch.testing.assert_close(outs[0][finite], outs[1][finite], atol=1e-5, rtol=1e-5)
