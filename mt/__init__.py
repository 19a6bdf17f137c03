"""Translation with Bayesian, predictive and evolving attention.

    python -m mt.prepare multi30k                      # tokenise, lowercase, BPE (cached)
    python -m mt.train --preset lstm-cpu               # LSTM seq2seq, additive attention
    python -m mt.train --preset transformer-cpu \
        "model.encoder_attention.cross_layer={kind: predictive, alpha: 0.1}"
    python -m mt.evaluate runs/mt/multi30k/lstm-cpu --split test_2016_flickr --beam 5
    echo "Ein Hund läuft im Park." | python -m mt.translate runs/mt/multi30k/lstm-cpu

Models: the seq2seq of Deng et al. 2018 (BiLSTM encoder, input-feeding LSTM decoder, MLP
attention with any ``common.attention`` normalizer) and a Transformer whose attention takes
every ``common.attention`` option (normalizers, predictive/evolving, convoluted attention,
position interactions). Decoding is ``common.decoding`` (greedy, batched beam search); BLEU
is ``sacrebleu``.
"""
