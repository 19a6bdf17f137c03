"""Text utilities shared by the sequence domains (translation, captioning, VQA questions)."""
from .vocab import Vocabulary

__all__ = ["Vocabulary"]
