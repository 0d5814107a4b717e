"""The rollout-graph figure says what it shows: a legend for node kinds and edge width, labels on
the credited nodes (matplotlib objects inspected, then the PNG written and read back)."""
import matplotlib.image as mpimg

from milegpo_cli.credit import Rollout
from milegpo_cli.experiments.diagnose import group_graph
from milegpo_cli.experiments.plots import is_png, rollout_graph, rollout_graph_figure

LONG = "countertop 1|inv:apple 1, knife 2, a very long inventory"


def graph():
    rollouts = [Rollout(group="g", rollout_id=i, states=["start", LONG if i < 3 else "cabinet"],
                        actions=["a", "b"], rewards=[0.0, 10.0 * (i < 3)], outcome=float(i < 3), success=i < 3)
                for i in range(4)]
    return group_graph(rollouts, "g")


def test_legend_and_labels_of_credited_nodes(tmp_path):
    fig = rollout_graph_figure(graph(), milestones={LONG: 0.8}, traps={"cabinet": -0.5, "start": -0.1}, start="start",
                               title="t")
    ax = fig.axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["milestone (1)", "trap (2)", "start state", "SUCCESS", "FAIL", "other state",
                      "1 rollout", "3 rollouts"]  # edge widths: thinnest and thickest transition
    assert "edge width = rollouts" in ax.get_legend().get_title().get_text()
    labels = [t.get_text() for t in ax.texts]
    assert "cabinet\nrho -0.50" in labels
    assert any(t.startswith("countertop 1|inv:apple 1") and t.endswith("…\nrho +0.80") for t in labels)
    assert {"start", "SUCCESS", "FAIL", "start\nrho -0.10"} <= set(labels)  # the start is a trap here: both labels
    path = rollout_graph(graph(), tmp_path / "g.png", milestones={LONG: 0.8}, start="start")
    assert is_png(path) and mpimg.imread(path).shape[1] > 600
