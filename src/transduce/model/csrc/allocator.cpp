// A block cache for large CPU tensors during training: transduce.model.kernels builds this file together with
// decoding.cpp (one extension module; decoding.cpp's module definition calls register_allocator).
//
// Why: training batches differ in shape from one update to the next, so the sizes of an update's large tensors
// (activations, attention weights, logits, their gradients) differ too. Through the C library's malloc those come
// from one heap, interleaved with the small long-lived allocations made meanwhile (oneDNN's primitives for each new
// shape among them); the heap fragments and grows while the free memory inside it is never given back: 2.3 GB free
// in the heap of a 3.5 GB Multi30k training process (d_model 128) after 150 updates. Giving large blocks back to
// the system at once instead (a lower mmap threshold) made the updates 75% slower: each new mapping is zero-filled
// page by page on first touch. So large tensors come from blocks mapped here and kept for reuse, within a bound:
//
// - an allocation of at least min_bytes takes the smallest kept block that holds it, if that block is at most a
//   quarter larger than asked; else a new block is mapped, its size rounded up to an eighth of an octave (so that a
//   slightly larger request later can reuse it). Smaller allocations go to the allocator that was installed before.
// - before a new block is mapped, the least recently freed kept blocks are unmapped until all mapped blocks stay
//   within limit_factor x the peak of the bytes in use (or the bytes in use plus the new block, if more).
// - release() unmaps every kept block. Once installed, the cache stays PyTorch's CPU allocator for the rest of the
//   process (memory that oneDNN allocated through it may be freed through whatever allocator is current then);
//   uninstall() makes it pass every allocation to the previous allocator, unmap its blocks as they are freed, and
//   unmap the kept ones now.

#include <torch/extension.h>

#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

constexpr size_t kPage = 4096;

// n rounded up to an eighth of its octave (and to whole pages): at most 12.5% more
size_t block_size(size_t n) {
  const int octave = 63 - __builtin_clzll(static_cast<unsigned long long>(n));
  const size_t step = std::max<size_t>(size_t(1) << std::max(octave - 3, 0), kPage);
  return (n + step - 1) / step * step;
}

class BlockCache final : public c10::Allocator {
 public:
  BlockCache(c10::Allocator* previous, size_t min_bytes, double limit_factor)
      : previous_(previous), min_bytes_(min_bytes), limit_factor_(limit_factor) {}

  c10::DataPtr allocate(size_t n) override {
    if (n < min_bytes_ || !serving_.load(std::memory_order_relaxed)) return previous_->allocate(n);
    void* p = take(n);
    return {p, p, &BlockCache::deleter, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &BlockCache::deleter; }

  void copy_data(void* dest, const void* src, size_t count) const override { default_copy_data(dest, src, count); }

  // A block back from its tensor: kept for reuse while serving, else unmapped.
  void give_back(void* p) {
    std::unique_lock<std::mutex> lock(mu_);
    auto it = in_use_blocks_.find(p);
    if (it == in_use_blocks_.end()) {  // a small allocation of the previous allocator, freed through raw_deleter
      lock.unlock();
      if (auto previous_deleter = previous_->raw_deleter()) previous_deleter(p);
      return;
    }
    const size_t size = it->second;
    in_use_blocks_.erase(it);
    in_use_ -= size;
    if (serving_.load(std::memory_order_relaxed)) {
      kept_.emplace(size, Kept{p, ++clock_});
      kept_bytes_ += size;
      return;
    }
    mapped_ -= size;
    ++unmaps_;
    lock.unlock();
    munmap(p, size);
  }

  // Unmap every kept block.
  void release() {
    std::vector<std::pair<void*, size_t>> blocks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [size, kept] : kept_) blocks.emplace_back(kept.p, size);
      unmaps_ += kept_.size();
      kept_.clear();
      mapped_ -= kept_bytes_;
      kept_bytes_ = 0;
    }
    for (const auto& [p, size] : blocks) munmap(p, size);
  }

  void serve(bool serving) { serving_.store(serving); }

  std::unordered_map<std::string, int64_t> stats() {
    std::lock_guard<std::mutex> lock(mu_);
    auto i = [](uint64_t v) { return static_cast<int64_t>(v); };
    return {{"in_use_bytes", i(in_use_)},  {"kept_bytes", i(kept_bytes_)}, {"mapped_bytes", i(mapped_)},
            {"peak_in_use_bytes", i(peak_)}, {"maps", i(maps_)},          {"reuses", i(reuses_)},
            {"unmaps", i(unmaps_)},          {"kept_blocks", i(kept_.size())}};
  }

  static BlockCache* instance;  // never deleted: tensors may outlive any scope, and are freed at exit

  static void deleter(void* p) { instance->give_back(p); }

 private:
  struct Kept {
    void* p;
    uint64_t freed;  // clock_ when it was freed: the least recently freed go first
  };

  void* take(size_t n) {
    std::vector<std::pair<void*, size_t>> unmap;
    void* p = nullptr;
    size_t size = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = kept_.lower_bound(n);
      if (it != kept_.end() && it->first <= n + n / 4) {
        p = it->second.p;
        size = it->first;
        kept_.erase(it);
        kept_bytes_ -= size;
        ++reuses_;
      } else {
        size = block_size(n);
        const double limit = limit_factor_ * static_cast<double>(std::max(peak_, in_use_ + size));
        const size_t bound = std::max(static_cast<size_t>(limit), in_use_ + size);
        while (mapped_ + size > bound && !kept_.empty()) {
          auto oldest = kept_.begin();
          for (auto j = kept_.begin(); j != kept_.end(); ++j)
            if (j->second.freed < oldest->second.freed) oldest = j;
          unmap.emplace_back(oldest->second.p, oldest->first);
          kept_bytes_ -= oldest->first;
          mapped_ -= oldest->first;
          ++unmaps_;
          kept_.erase(oldest);
        }
        mapped_ += size;  // counted now, so that another thread's bound sees it
        ++maps_;
      }
      in_use_ += size;
      peak_ = std::max(peak_, in_use_);
    }
    for (const auto& [q, q_size] : unmap) munmap(q, q_size);
    if (p == nullptr) {
      p = map(size);
      if (p == nullptr) {  // out of address space or memory: give back everything kept, then try once more
        release();
        p = map(size);
      }
      if (p == nullptr) {
        std::lock_guard<std::mutex> lock(mu_);
        in_use_ -= size;
        mapped_ -= size;
      }
      TORCH_CHECK(p != nullptr, "transduce's block cache: cannot map ", size, " bytes");
    }
    std::lock_guard<std::mutex> lock(mu_);
    in_use_blocks_.emplace(p, size);
    return p;
  }

  static void* map(size_t size) {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }

  c10::Allocator* previous_;
  const size_t min_bytes_;
  const double limit_factor_;
  std::mutex mu_;
  std::atomic<bool> serving_{true};
  std::unordered_map<void*, size_t> in_use_blocks_;  // block -> its size
  std::multimap<size_t, Kept> kept_;                // size -> freed block
  uint64_t in_use_ = 0, kept_bytes_ = 0, mapped_ = 0, peak_ = 0;
  uint64_t clock_ = 0, maps_ = 0, reuses_ = 0, unmaps_ = 0;
};

BlockCache* BlockCache::instance = nullptr;
int serving = 0;  // install() calls not undone yet (one per training run in this process)

// Make the block cache serve CPU tensors of at least min_bytes (the settings of the first call stay); false if
// another CPU allocator of higher priority stays in place.
bool install(int64_t min_bytes, double limit_factor) {
  TORCH_CHECK(min_bytes > 0 && limit_factor >= 1.0, "block cache: min_bytes > 0 and limit_factor >= 1 required");
  if (BlockCache::instance == nullptr) {
    auto* cache = new BlockCache(c10::GetCPUAllocator(), static_cast<size_t>(min_bytes), limit_factor);
    c10::SetCPUAllocator(cache, /*priority=*/0);
    if (c10::GetCPUAllocator() != cache) {
      delete cache;  // never PyTorch's allocator: nothing came from it
      return false;
    }
    BlockCache::instance = cache;
  }
  if (c10::GetCPUAllocator() != BlockCache::instance) return false;
  if (serving++ == 0) BlockCache::instance->serve(true);
  return true;
}

// Undo one install(); after the last, allocations go to the previous allocator and the kept blocks are unmapped.
void uninstall() {
  if (BlockCache::instance == nullptr || serving == 0) return;
  if (--serving > 0) return;
  BlockCache::instance->serve(false);
  BlockCache::instance->release();
}

std::unordered_map<std::string, int64_t> stats() {
  if (BlockCache::instance == nullptr) return {};
  auto s = BlockCache::instance->stats();
  s["serving"] = serving > 0;
  return s;
}

}  // namespace

void register_allocator(pybind11::module_& m) {
  m.def("block_cache_install", &install, "take CPU tensors of at least min_bytes from the block cache",
        pybind11::arg("min_bytes"), pybind11::arg("limit_factor"));
  m.def("block_cache_uninstall", &uninstall, "undo one block_cache_install");
  m.def("block_cache_release", []() { if (BlockCache::instance != nullptr) BlockCache::instance->release(); },
        "unmap the kept blocks");
  m.def("block_cache_stats", &stats, "bytes in use, kept and mapped; peak; maps, reuses and unmaps");
}
