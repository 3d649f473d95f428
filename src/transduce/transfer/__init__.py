"""What a trained encoder is good for beyond translation: contextual word vectors (CoVe), a sentence classifier
fine-tuned from it (BERT-style), masked-LM pretraining, and starting any encoder from a pretrained one."""
