"""benchmarks/finetune.py's accounting (never its speed): the ideal times are built from the work the sampler
counted, and the stage bound is their sum."""

from __future__ import annotations

import pytest


def test_finetune_benchmark_accounts_for_the_work_it_ran() -> None:
    from benchmarks.finetune import run

    r = run(model="tiny", episodes=4, seed=0, threads=1)
    assert r["perf/sample_prefilled_tokens"] > 0 and r["perf/sample_decode_steps"] > 0
    # a group of G = 4 samples of one task shares its prefill: fewer positions prefilled than prompts processed
    assert r["perf/sample_prefilled_tokens"] < r["perf/tokens_processed"]
    # every sampled token after a row's first (which the prefill gives) costs that row one decode step; in this
    # config the trained solver makes the only LLM calls, so the counters must add up to its tokens exactly
    generated = round(r["perf/sample_generated_tok_s"] * r["perf/sample_seconds"])
    assert r["perf/sample_decode_row_steps"] == generated - r["perf/turns"]
    assert r["perf/sample_mean_rows_per_step"] == pytest.approx(
        r["perf/sample_decode_row_steps"] / r["perf/sample_decode_steps"]
    )
    assert r["perf/sample_mean_rows_per_step"] > 1.0  # the 4 episodes' turns were decoded together, not one by one
    assert r["perf/decode_roofline_ms_1_row"] > 0 and r["perf/sample_ideal_seconds"] > 0
    assert r["perf/sample_ideal_share"] == pytest.approx(r["perf/sample_ideal_seconds"] / r["perf/sample_seconds"])
    assert r["perf/stage_bound_seconds"] == pytest.approx(
        r["perf/sample_ideal_seconds"] + r["perf/train_ideal_seconds"] + r["perf/kl_check_ideal_seconds"]
    )
