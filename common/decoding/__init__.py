"""Search for autoregressive decoders: greedy and batched beam search over a ``step`` function.

>>> from common.decoding import beam_search
>>> def step(tokens, state):                 # tokens [N], state: nest of tensors with dim 0 = N
...     log_probs, state = model.decode_step(tokens, state)
...     return log_probs, state               # [N, V]
>>> hyps, scores = beam_search(step, encoder_state, batch_size=B, bos=2, eos=3, max_len=50, beam_size=5)
"""
from .search import beam_search, greedy_search, map_state

__all__ = ["beam_search", "greedy_search", "map_state"]
