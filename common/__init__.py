"""Shared core of the attention suite: attention variants and training/evaluation utilities.

``common`` never imports a domain package (graphattn, vqa, captioning, mt).
"""
__version__ = "0.1.0"
