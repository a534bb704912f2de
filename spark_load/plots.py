"""PNG plots of a run from the report's small aggregates (matplotlib, no display)."""

from __future__ import annotations

from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def latency_plot(report: dict, path: Path) -> Path:
    plt = _pyplot()
    hist = report["series"]["latency_hist"]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    if hist:
        lows = [h[0] for h in hist]
        widths = [h[1] - h[0] for h in hist]
        ax.bar(lows, [h[2] for h in hist], width=widths, align="edge", color="#4c72b0",
               edgecolor="#34507d", linewidth=0.5)
        ax.set_xscale("log")
    latency = report["latency_ms"]
    for name, style in (("p50", "-"), ("p90", "--"), ("p99", "-."), ("p999", ":")):
        if latency.get(name) is not None:
            ax.axvline(latency[name], color="#c44e52", linestyle=style, linewidth=1,
                       label=f"{name} {latency[name]:.2f} ms")
    ax.set_xlabel("end-to-end latency (ms, log scale)")
    ax.set_ylabel("messages")
    ax.set_title(f"latency distribution, run {report['run_id']} ({report['received_distinct']} messages)")
    if hist:
        ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
    return path


def throughput_plot(report: dict, path: Path) -> Path:
    plt = _pyplot()
    series = report["series"]
    width = series["bucket_s"] or 1.0
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    for key, label, color in (("sent", "sent (by first send time)", "#55a868"),
                              ("received", "received (first copies)", "#4c72b0")):
        points = series[key]
        if points:
            ax.step([b * width for b, _ in points], [n / width for _, n in points], where="post",
                    label=label, color=color)
    ax.set_xlabel("seconds since the first send")
    ax.set_ylabel("messages / s")
    rate = report.get("throughput_msgs_per_s")
    title = f"throughput over time, run {report['run_id']}"
    if rate:
        title += f" (mean {rate:,.0f} msg/s)"
    ax.set_title(title)
    ax.set_ylim(bottom=0)
    if series["sent"] or series["received"]:
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
    return path


def write_plots(report: dict, out: Path) -> dict:
    return {"latency": str(latency_plot(report, out / "latency.png").name),
            "throughput": str(throughput_plot(report, out / "throughput.png").name)}
