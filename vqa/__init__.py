"""Visual question answering on VQA v2: MCAN (``vqa.mcan``) and LXMERT adaptive fine-tuning
(``vqa.lxmert``) with the suite's attention variants.

* ``vqa.answers``: the official answer normalisation, MCAN's soft scores, ``AnswerVocab``;
* ``vqa.data``: official questions/annotations files, MCAN's tokeniser, GloVe, ``VQADataset``;
* ``vqa.evaluation``: the official accuracy and results format;
* ``vqa.fixtures``: a small dataset in the official formats for tests and demos;
* ``python -m vqa.train`` / ``python -m vqa.evaluate``: MCAN training, and evaluation on
  clean and noisy features with Monte Carlo uncertainty (PAvPU, ECE); ``vqa.config`` holds the
  config, ``vqa.training`` the training work (imported once the command line is checked), ``vqa.run_inputs`` a
  run's inputs and ``vqa.predict`` the model of a config and its answer logits.
"""
