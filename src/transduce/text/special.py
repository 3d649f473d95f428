"""Special token ids, defined once for the whole package.

The SentencePiece models trained by ``transduce prepare`` reserve exactly these ids, the model config defaults
to them and every batch is padded with ``PAD_ID``. The prepared-data manifest records them, so a vocabulary made
with other ids is detected instead of silently misread.
"""

PAD_ID = 0  # padding; never a training target, masked out of attention and loss
BOS_ID = 1  # beginning of sentence: the first decoder input
EOS_ID = 2  # end of sentence: appended to every source and every target
UNK_ID = 3  # unknown piece (rare: byte fallback covers any character)

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"

SPECIAL_IDS = {"pad": PAD_ID, "bos": BOS_ID, "eos": EOS_ID, "unk": UNK_ID}
