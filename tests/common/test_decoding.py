"""Greedy and batched beam search (common.decoding) on small random recurrent 'models'."""
import itertools
import math

import pytest
import torch

from common.decoding import beam_search, greedy_search

BOS, EOS, PAD = 0, 1, 2


class TinyRNN:
    """A fixed random GRU language model conditioned on a per-sentence start state."""

    def __init__(self, vocab=6, hidden=8, seed=0, eos_bias=0.0):
        g = torch.Generator().manual_seed(seed)
        self.emb = torch.randn(vocab, hidden, generator=g)
        self.cell = torch.nn.GRUCell(hidden, hidden)
        with torch.no_grad():
            for p in self.cell.parameters():
                p.copy_(torch.randn(p.shape, generator=g))
        self.out = torch.randn(hidden, vocab, generator=g) * 2
        self.out_bias = torch.zeros(vocab)
        self.out_bias[EOS] = eos_bias
        self.out_bias[BOS] = -1e4  # never emitted

    def step(self, tokens, state):
        h = self.cell(self.emb[tokens], state["h"])
        return torch.log_softmax(h @ self.out + self.out_bias, -1), {"h": h, "extra": (state["extra"],)}

    def start(self, batch, seed=1):
        g = torch.Generator().manual_seed(seed)
        return {"h": torch.randn(batch, self.cell.hidden_size, generator=g), "extra": torch.arange(batch)}

    def nested_step(self, tokens, state):
        log_probs, new = self.step(tokens, state)
        return log_probs, {"h": new["h"], "extra": state["extra"]}

    @torch.no_grad()
    def score(self, sequence, state_row):
        """Total log-probability of ``sequence`` (no bos) from one start state."""
        state = {"h": state_row.unsqueeze(0), "extra": torch.zeros(1)}
        tokens, total = torch.tensor([BOS]), 0.0
        for tok in sequence:
            log_probs, state = self.nested_step(tokens, state)
            total += float(log_probs[0, tok])
            tokens = torch.tensor([tok])
        return total


def test_greedy_rows_end_with_eos_then_pad():
    model = TinyRNN(eos_bias=1.0)
    out = greedy_search(model.nested_step, model.start(16), 16, BOS, EOS, max_len=12, pad=PAD)
    assert out.shape[0] == 16 and out.shape[1] <= 12
    for row in out.tolist():
        if EOS in row:
            i = row.index(EOS)
            assert all(t == PAD for t in row[i + 1:])
        else:
            assert len(row) == 12


def test_beam_one_equals_greedy():
    model = TinyRNN(vocab=7, seed=3, eos_bias=0.5)
    state = model.start(32, seed=4)
    greedy = greedy_search(model.nested_step, state, 32, BOS, EOS, max_len=15)
    beam, scores = beam_search(model.nested_step, state, 32, BOS, EOS, max_len=15, beam_size=1)
    assert torch.equal(beam, greedy)
    for row, score, h in zip(beam.tolist(), scores.tolist(), state["h"]):
        seq = row[: row.index(EOS) + 1] if EOS in row else row
        assert score == pytest.approx(model.score(seq, h) / len(seq), abs=1e-4)


def _all_hypotheses(vocab, max_len):
    words = [t for t in range(vocab) if t not in (BOS, EOS)]
    for n in range(max_len):
        for prefix in itertools.product(words, repeat=n):
            yield list(prefix) + [EOS]
    yield from (list(p) for p in itertools.product(words, repeat=max_len))


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_wide_beam_finds_the_exact_best_hypothesis(length_penalty):
    vocab, max_len = 5, 4
    model = TinyRNN(vocab=vocab, seed=5, eos_bias=0.3)
    state = model.start(3, seed=6)
    out, scores = beam_search(model.nested_step, state, 3, BOS, EOS, max_len=max_len, beam_size=64,
                              length_penalty=length_penalty)
    for b in range(3):
        best = max(_all_hypotheses(vocab, max_len),
                   key=lambda s: model.score(s, state["h"][b]) / len(s) ** length_penalty)
        expected = model.score(best, state["h"][b]) / len(best) ** length_penalty
        assert scores[b].item() == pytest.approx(expected, abs=1e-4)
        assert out[b, : len(best)].tolist() == best


def test_batched_beam_equals_one_sentence_at_a_time():
    model = TinyRNN(vocab=9, seed=7, eos_bias=0.2)
    state = model.start(6, seed=8)
    batched, batched_scores = beam_search(model.nested_step, state, 6, BOS, EOS, max_len=10, beam_size=4, pad=PAD)
    for b in range(6):
        single_state = {"h": state["h"][b:b + 1], "extra": state["extra"][b:b + 1]}
        single, score = beam_search(model.nested_step, single_state, 1, BOS, EOS, max_len=10, beam_size=4, pad=PAD)
        n = single.shape[1]
        assert batched[b, :n].tolist() == single[0].tolist()
        assert (batched[b, n:] == PAD).all()
        assert batched_scores[b].item() == pytest.approx(score.item(), abs=1e-5)


def test_beam_reorders_nested_state_and_never_scores_worse_than_greedy():
    model = TinyRNN(vocab=8, seed=9, eos_bias=0.4)
    state = model.start(20, seed=10)
    greedy = greedy_search(model.step, state, 20, BOS, EOS, max_len=12)
    beam, scores = beam_search(model.step, state, 20, BOS, EOS, max_len=12, beam_size=5)
    for b in range(20):
        row = greedy[b].tolist()
        seq = row[: row.index(EOS) + 1] if EOS in row else row
        assert scores[b].item() >= model.score(seq, state["h"][b]) / len(seq) - 1e-5
        brow = beam[b].tolist()
        bseq = brow[: brow.index(EOS) + 1] if EOS in brow else brow
        assert scores[b].item() == pytest.approx(model.score(bseq, state["h"][b]) / len(bseq), abs=1e-4)


def test_immediate_eos_and_state_checks():
    def step(tokens, state):
        log_probs = torch.full((tokens.shape[0], 4), -10.0)
        log_probs[:, EOS] = math.log(0.9)
        return log_probs, state

    out, scores = beam_search(step, None, 2, BOS, EOS, max_len=5, beam_size=3)
    assert out.tolist() == [[EOS], [EOS]]
    assert torch.allclose(scores, torch.full((2,), math.log(0.9)))
    with pytest.raises(ValueError, match="batch_size"):
        greedy_search(step, torch.zeros(3, 2), 2, BOS, EOS, max_len=5)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_finished_sentences_leave_the_batch(beam_size):
    """Sentence b prefers eos from step b + 1 on; later steps only see the sentences still running."""
    seen = []

    def step(tokens, state):
        seen.append(tokens.shape[0])
        t = state["t"] + 1
        log_probs = torch.full((tokens.shape[0], 5), -5.0)
        log_probs[:, 4] = -0.1
        log_probs[state["stop"] <= t, EOS] = -0.01
        return torch.log_softmax(log_probs, -1), {"t": t, "stop": state["stop"]}

    state = {"t": torch.zeros(3, dtype=torch.long), "stop": torch.tensor([1, 2, 3])}
    search = (lambda: greedy_search(step, state, 3, BOS, EOS, max_len=6, pad=PAD)) if beam_size == 1 else \
        (lambda: beam_search(step, state, 3, BOS, EOS, max_len=6, beam_size=beam_size, pad=PAD)[0])
    out = search()
    assert out.tolist() == [[EOS, PAD, PAD], [4, EOS, PAD], [4, 4, EOS]]
    if beam_size == 1:
        assert seen == [3, 2, 1]
    else:  # a sentence leaves once it holds beam_size finished hypotheses
        assert seen[0] == 3 * beam_size and seen == sorted(seen, reverse=True) and seen[-1] == beam_size
