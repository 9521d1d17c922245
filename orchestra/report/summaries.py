"""Plain-text views for the terminal: a trajectory file's summary, one episode as a transcript, a dataset's summary."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trajectories import Episode


def format_stats(s: dict[str, Any]) -> str:
    """``trajectories.summarize``'s dict, nested keys indented."""
    lines = [f"{k}: {v}" for k, v in s.items() if not isinstance(v, dict)]
    for k, v in s.items():
        if isinstance(v, dict):
            lines.append(f"{k}:")
            for kk, vv in v.items():
                lines.append(f"  {kk}: {vv}")
    return "\n".join(lines)


def format_episode(ep: Episode) -> str:
    """One episode as a readable transcript: the task, each conductor decision with its reward, each message."""
    lines = [
        f"episode {ep.episode_id}  conductor={ep.conductor.name}  task={ep.task.id} ({ep.task.family}, {ep.task.split})",
        f"success={ep.success} score={ep.score} return={ep.return_:.3f} terminated={ep.terminated} truncated={ep.truncated}",
        *(
            [
                f"ENDED BY A FAULT ({ep.error.cause}, {ep.error.worker}'s turn, attempt {ep.error.attempts}): {ep.error.message}"
            ]
            if ep.error is not None
            else []
        ),
        "",
        ep.steps[0].state["task"]["prompt"] if ep.steps else "",
        "",
    ]
    for st in ep.steps:
        label = "submit" if st.action.kind == "submit" else f"{st.action.worker}:{st.action.instruction}"
        lines.append(f"[t={st.t}] conductor → {label}   reward {st.reward.scalar:+.3f} {st.reward.named}")
        if st.action.text is not None:  # the conductor's own words; the label above is the nearest declared action
            lines.append(
                f'    own instruction: "{st.action.text}" (mapped to {st.action.label}, action {st.action.id}, '
                f"cos {st.action.similarity:.2f})"
            )
        if st.message is not None:
            tag = f" [{st.message.verdict}]" if st.message.verdict else ""
            lines.append(
                f"    {st.message.worker}{tag} ({st.message.completion_tokens} tok): {st.message.text.strip()}"
            )
    lines.append(f"\nverdict: {ep.metadata.get('verdict_reason', '')}")
    return "\n".join(lines)


def format_dataset_summary(s: dict[str, Any]) -> str:
    """``ConductorDataset.summary()``: size, layout, actions, returns per source conductor."""
    lines = [
        f"team {s['team']}: {s['episodes']} episodes, {s['transitions']} decisions, "
        f"observation {s['observation_size']} floats, {s['num_actions']} actions, "
        f"success {100 * s['success_rate']:.1f}%, {s['truncated_episodes']} truncated",
        "actions: " + ", ".join(f"{k} {v}" for k, v in s["action_histogram"].items() if v),
    ]
    own = s.get("own_instructions", [])
    if own:
        lines.append(
            f"instructions in the conductor's own words: {len(own)}, each kept and mapped to a discrete action:"
        )
        for o in own[:10]:
            lines.append(f'  "{o["text"]}" → {o["label"]} (action {o["action"]}, cos {o["similarity"]:.2f})')
        if len(own) > 10:
            lines.append(f"  ... and {len(own) - 10} more")
    lines.append("per source conductor:")
    for name, c in s["per_conductor"].items():
        lines.append(
            f"  {name:22s} {c['episodes']:4d} ep  success {100 * c['success_rate']:5.1f}%  return "
            f"mean {c['return_mean']:+.3f} sd {c['return_std']:.3f} [min {c['return_min']:+.3f}, "
            f"median {c['return_p50']:+.3f}, max {c['return_max']:+.3f}]"
        )
    return "\n".join(lines)


__all__ = ["format_dataset_summary", "format_episode", "format_stats"]
