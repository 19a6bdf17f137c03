"""GLUE fine-tuning of pretrained Transformer encoders with the suite's attention (BAM paper, Table 5)."""
