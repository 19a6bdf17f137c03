"""Image captioning: Att2in (Rennie et al., 2017; self-critical.pytorch's ``att2in2``) on COCO
bottom-up region features, with any attention normalizer of :mod:`common.attention`.

Pipeline (BAM paper, Sec. 4.3 and Table 3)::

    python -m captioning.train --demo                              # all of it on synthetic data, no download
    python -m captioning.prepare                                   # dataset_coco.json -> vocab + captions
    python -m captioning.train --attention bam-wc                  # XE + scheduled sampling, best val CIDEr
    python -m captioning.evaluate runs/captioning/bam-wc --beam-size 5      # BLEU/METEOR/ROUGE-L/CIDEr
    python -m captioning.visualize runs/captioning/bam-wc --image-id 273052 --image COCO_val2014_000000273052.jpg

Model in code: :class:`captioning.models.Att2in`; its ``step`` plugs into
:func:`common.decoding.greedy_search` / ``beam_search``. Settings: ``captioning/configs/att2in.yaml``.
``captioning.fixtures.write_karpathy_fixture`` writes a small synthetic dataset for tests and demos.
"""
