"""Converting dense attention problems to the edge-wise layout, for cross-layout tests."""


def dense_to_edges(scores, mask, keys=None):
    """Turn dense ``[B, H, Q, K]`` scores (+ mask ``[B, 1, Q, K]``) into edge-wise form.

    Every (batch, query) pair is one target node; every unmasked key is one edge. Returns
    ``(edge_scores [E, H], index [E], num_nodes, key_index [E], node_keys, positions)`` where
    ``node_keys`` is ``[B*K, H, d]`` (keys as source nodes) and ``positions`` indexes the
    dense tensor for comparisons.
    """
    B, H, Q, K = scores.shape
    full = mask.expand(B, 1, Q, K)[:, 0]
    b, q, k = full.nonzero(as_tuple=True)
    edge_scores = scores[b, :, q, k]
    index = b * Q + q
    key_index = b * K + k
    node_keys = None
    if keys is not None:  # [B, H, K, d] -> [B*K, H, d]
        node_keys = keys.permute(0, 2, 1, 3).reshape(B * K, H, keys.shape[-1])
    return edge_scores, index, B * Q, key_index, node_keys, (b, q, k)


def edges_to_dense(values, positions, shape):
    """Scatter edge values ``[E, H]`` back into a zero dense tensor of ``shape``."""
    b, q, k = positions
    out = values.new_zeros(shape)
    out[b, :, q, k] = values
    return out
