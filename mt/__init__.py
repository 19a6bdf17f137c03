"""Machine translation: LSTM seq2seq and Transformers with the suite's attention variants (in progress)."""
