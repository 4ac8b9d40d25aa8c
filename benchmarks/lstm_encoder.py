"""The LSTM encoder's two ways over a padded batch, side by side (``FastPaths.lstm_by_length``): torch's LSTM once
per distinct source length, the state carried between the calls, against packed sequences.

    .venv/bin/python benchmarks/lstm_encoder.py                 # the grid below, 5 rounds
    .venv/bin/python benchmarks/lstm_encoder.py --rounds 9 --threads 1

Each row is one batch of 64 sources (emb 64 / hidden 128, the benchmark's sizes) with ``lengths`` distinct lengths
spread evenly up to the longest, ``T``; its padding is the share of the batch's positions past a source's end. Each
round times the encoder's forward and backward (the states and the final cell into one loss) both ways, alternating;
the medians over rounds, and ``by length / packed`` (below 1: the calls by length are the faster). Length bucketing
gives the training's batches 1-3 lengths and ~2% padding; random batches of 64 about 30 lengths and ~43%.
``rnn_encoder.MOST_LSTM_CALLS`` is where the calls by length stop paying.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from attnseq.kernels import FastPaths
from attnseq.model.rnn_encoder import RNNEncoder

GRID = ((22, 1, "narrow"), (22, 3, "narrow"), (40, 3, "narrow"), (22, 8, "wide"), (22, 12, "wide"), (40, 8, "wide"),
        (40, 12, "wide"), (40, 20, "wide"), (40, 30, "wide"))
"""(longest length T, distinct lengths, spread) per row: ``narrow``, consecutive lengths up to T (what length bucketing
gives); ``wide``, spread evenly from T / 4 to T (random batches)."""
BATCH, SIZES, VOCAB = 64, (64, 128), 20


def batch(longest: int, distinct: int, spread: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Sources ``(B, T)`` padded with 0 past each length, and their lengths ``(B,)``: ``distinct`` lengths down from
    ``longest`` (``GRID``'s spreads), each row's drawn among them (the first row the longest)."""
    generator = torch.Generator().manual_seed(seed)
    shortest = longest - distinct + 1 if spread == "narrow" else max(1, longest // 4)
    choices = torch.linspace(longest, shortest, distinct).round().long()  # (k,)
    lengths = choices[torch.randint(0, distinct, (BATCH,), generator=generator)]  # (B,)
    lengths[0] = longest
    src = torch.randint(1, VOCAB, (BATCH, longest), generator=generator)  # (B, T)
    src[torch.arange(longest)[None, :] >= lengths[:, None]] = 0
    return src, lengths


def timed(encoder: RNNEncoder, src: torch.Tensor, lengths: torch.Tensor, repeats: int) -> float:
    """The median of ``repeats`` forward + backward passes, in seconds."""
    seconds = []
    for _ in range(repeats):
        began = time.perf_counter()
        keys, (_, cell) = encoder(src, lengths)  # (B, T, d), (1, B, d)
        (keys.sum() + cell.sum()).backward()
        seconds.append(time.perf_counter() - began)
    return statistics.median(seconds)


def measure(rounds: int, repeats: int, grid=GRID) -> list[dict]:
    emb, hidden = SIZES
    encoders = {
        way: RNNEncoder(VOCAB, emb, hidden, cell="lstm", fast_paths=FastPaths(lstm_by_length=on))
        for way, on in (("by length", True), ("packed", False))
    }
    for encoder in encoders.values():
        encoder.load_state_dict(encoders["packed"].state_dict())
    rows = []
    for longest, distinct, spread in grid:
        src, lengths = batch(longest, distinct, spread)
        for encoder in encoders.values():
            timed(encoder, src, lengths, 2)  # warm-up
        seconds: dict[str, list[float]] = {way: [] for way in encoders}
        for _ in range(rounds):
            for way, encoder in encoders.items():
                seconds[way].append(timed(encoder, src, lengths, repeats))
        padding = 1 - float(lengths.sum()) / src.numel()
        rows.append({"T": longest, "lengths": len(torch.unique(lengths)), "padding": padding,
                     **{way: statistics.median(values) for way, values in seconds.items()}})
    return rows


def render(rows: list[dict], command: str, threads: int) -> str:
    lines = [
        "## The LSTM encoder by length",
        "",
        f"`{command}`; batch {BATCH}, emb {SIZES[0]} / hidden {SIZES[1]}, {threads} torch threads; forward + backward,"
        " medians over rounds.",
        "",
        "| T | lengths | padding | by length ms | packed ms | by length / packed |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(f"| {row['T']} | {row['lengths']} | {100 * row['padding']:.0f}% | {1e3 * row['by length']:.2f} | "
                     f"{1e3 * row['packed']:.2f} | {row['by length'] / row['packed']:.2f}× |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds per row, the two ways alternating")
    parser.add_argument("--repeats", type=int, default=5, help="passes per way and round (their median)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    args = parser.parse_args(argv)
    if min(args.rounds, args.repeats, args.threads) < 1:
        parser.error("--rounds, --repeats and --threads must be at least 1")
    torch.set_num_threads(args.threads)
    command = "python benchmarks/lstm_encoder.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print(render(measure(args.rounds, args.repeats), command.strip(), args.threads))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
