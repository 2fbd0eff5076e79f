"""Comparison and figure of the elastic loss-curve experiment (bench/elastic_training.py).

:func:`compare` sets a schedule's per-step records beside its uninterrupted reference: which
steps have the same global batch (hash), which reference step trained on the same sequences
when the batch differs, and how far the losses are apart. :func:`plot` draws the loss curves
and the per-step loss differences with the resume points marked (matplotlib, from the ``dev``
extra).
"""

from __future__ import annotations

from typing import Any

__all__ = ["compare", "plot", "segments"]

_FLOOR = 1e-9  # where a bitwise-equal loss (difference 0) is drawn on the log axis


def segments(same_as: dict[str, int | None]) -> list[dict[str, Any]]:
    """Runs of consecutive steps whose sequences are those of consecutive reference steps
    (``ref_first`` None: sequences the reference never trained on)."""
    out: list[dict[str, Any]] = []
    for key in sorted(same_as, key=int):
        step, ref = int(key), same_as[key]
        last = out[-1] if out else None
        if last is not None and last["last"] == step - 1 and (
                (ref is None and last["ref_first"] is None)
                or (ref is not None and last["ref_first"] is not None
                    and ref - last["ref_first"] == step - last["first"])):
            last["last"] = step
        else:
            out.append({"first": step, "last": step, "ref_first": ref})
    return out


def compare(ref: list[dict[str, Any]], run: list[dict[str, Any]], key: str,
            resumes: list[int]) -> dict[str, Any]:
    """``run`` against ``ref`` step by step; ``key`` names the hash compared."""
    if [r["step"] for r in ref] != [r["step"] for r in run]:
        raise SystemExit("the schedules did not log the same steps")
    pairs = list(zip(ref, run, strict=True))
    differ = [s["step"] for r, s in pairs if r[key] != s[key]]
    diffs = [abs(r["loss"] - s["loss"]) for r, s in pairs]
    first = resumes[0] if resumes else len(diffs)
    after = diffs[first:]
    ref_step = {r["rows_set_sha256"]: r["step"] for r in ref}
    # for each step whose batch differs: the reference step that trained on the same
    # sequences (in any order), or None: data the reference never saw
    same_as = {str(s["step"]): ref_step.get(s["rows_set_sha256"]) for r, s in pairs
               if r[key] != s[key]}
    return {
        "hash": key,
        "steps": len(ref),
        "steps_hash_equal": len(ref) - len(differ),
        "first_step_hash_differs": differ[0] if differ else None,
        "max_abs_loss_diff": max(diffs),
        "max_abs_loss_diff_before_resume": max(diffs[:first], default=0.0),
        "mean_abs_loss_diff_after_resume": sum(after) / len(after) if after else 0.0,
        "same_sequences_as": same_as,
        "same_sequences_segments": segments(same_as),
        "final_loss_ref": ref[-1]["loss"],
        "final_loss": run[-1]["loss"],
    }


def plot(curves: dict[str, list[dict[str, Any]]], pairs: list[tuple[str, str]],
         control: tuple[str, str] | None, resumes: list[tuple[int, str]], out: str,
         title: str) -> None:
    """Loss curves of ``pairs`` (top) and |loss - reference| per step (bottom, log scale);
    ``control`` is drawn in the bottom panel only, in grey."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7.5), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})

    def diff_line(ref: str, run: str, color: str, lw: float, label: str) -> None:
        diffs = [max(abs(a["loss"] - b["loss"]), _FLOOR)
                 for a, b in zip(curves[ref], curves[run], strict=True)]
        bottom.plot([r["step"] for r in curves[run]], diffs, color=color, lw=lw, label=label)
        key = "global_hash" if "global_hash" in curves[ref][0] else "tokens_sha256"
        other = [(b["step"], d) for a, b, d in zip(curves[ref], curves[run], diffs, strict=True)
                 if a[key] != b[key]]
        if other:
            bottom.plot(*zip(*other, strict=True), "x", color=color, ms=4,
                        label=f"{run}: another global batch than {ref}")

    drawn: set[str] = set()  # a reference shared by two pairs is drawn once
    for i, (ref, run) in enumerate(pairs):
        color = f"C{i}"
        for name, ls, lw, alpha in ((ref, "-", 2.4, 0.5), (run, "--", 1.2, 1.0)):
            if name in drawn:
                continue
            drawn.add(name)
            top.plot([r["step"] for r in curves[name]], [r["loss"] for r in curves[name]], ls,
                     lw=lw, color=color, alpha=alpha, label=name)
        diff_line(ref, run, color, 1.2, f"|{run} - {ref}|")
    if control is not None:
        ref, run = control
        diff_line(ref, run, "grey", 0.9,
                  f"|{run} - {ref}| (control: same data, uninterrupted, another world size)")
    for ax in (top, bottom):
        for step, _ in resumes:
            ax.axvline(step, color="grey", ls=":", lw=1)
    for step, label in resumes:
        top.annotate(label, (step, 1.0), xycoords=("data", "axes fraction"),
                     xytext=(3, -12), textcoords="offset points", color="grey")
    top.set_ylabel("loss (mean over the global batch's tokens)")
    top.set_title(title, fontsize=10)
    top.legend(fontsize=8, loc="center right")
    bottom.set_yscale("log")
    bottom.set_ylim(_FLOOR / 3, 1e4)  # room for the legend above the lines
    bottom.set_ylabel(f"|loss difference|  ({_FLOOR:g} = equal)")
    bottom.set_xlabel("step")
    bottom.legend(fontsize=7, loc="upper left", ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
