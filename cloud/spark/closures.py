"""Dedicated Spark algorithms for the closure hyper-nodes ``detect_closure`` recognises.

Both return exactly the facts the engine's closure modules make visible for the relation R,
given X, the R facts visible before the hyper-node (explicit ones and those derived by earlier
hyper-nodes), i.e. the least fixpoint of the node's rules over X:

* transitive closure: L = X+ (every pair joined by a walk of one or more X edges); irreflexive
  variant (``COMP(x, !=, z)``): L = {(u, v) in X+ : u != v} plus the loops of X. (A shortest walk
  between u != v has distinct vertices, so the rule derives (u, v) along it; it never derives
  (u, u).)
* symmetric-transitive closure: with C ranging over the connected components of the undirected
  graph of X, L = C x C ((u, u) included: u - v - u); irreflexive: the pairs of C x C with
  u != v, plus (u, u) only for the loops of X (``modules/symmetric_transitive.py``).

Transitive closure is seminaive *squaring*: each round joins the new pairs with the whole
closure on both sides, so a walk of length k is found after about log2(k) rounds (Spark pays
per round, not per join). Connected components use the large-star / small-star algorithm of
Kiveris et al., "Connected Components in MapReduce and Beyond" (SoCC 2014): O(log^2 n) rounds of
two group-bys, no per-vertex message passing. Lineage is cut with local checkpoints.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from cloud.spark.frames import cut, settle

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

CHECKPOINT_EVERY = 4  # rounds between checkpoints of the growing closure
Tick = Callable[[str], None]


def transitive_closure(facts: DataFrame, irreflexive: bool, tick: Tick | None = None) -> DataFrame:
    """``facts``: X as columns ``c0, c1`` (distinct). Returns L (see module docstring)."""
    from pyspark.sql import functions as F

    edges = facts.select(F.col("c0").alias("s"), F.col("c1").alias("d"))
    closure, delta, rounds = edges, edges, 0
    while True:
        rounds += 1
        left = delta.select("s", F.col("d").alias("m")).join(
            closure.select(F.col("s").alias("m"), "d"), "m"
        )
        right = closure.select("s", F.col("d").alias("m")).join(
            delta.select(F.col("s").alias("m"), "d"), "m"
        )
        new, size = settle(
            left.select("s", "d").union(right.select("s", "d")).distinct().subtract(closure)
        )
        if not size:
            break
        closure = closure.union(new)
        if rounds % CHECKPOINT_EVERY == 0:
            closure = cut(closure)
        delta = new
        if tick:
            tick(f"transitive closure round {rounds}")
    if irreflexive:
        closure = closure.where(F.col("s") != F.col("d")).union(
            edges.where(F.col("s") == F.col("d"))
        )
    return closure.select(F.col("s").alias("c0"), F.col("d").alias("c1")).distinct()


def _large_star(edges: DataFrame) -> DataFrame:
    """Attach every neighbour v > u of u to the smallest vertex m of u's closed neighbourhood.

    ``edges``: ``(a, b)`` with a < b; so is the result (m <= u < v)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    both = edges.union(edges.select(F.col("b").alias("a"), F.col("a").alias("b")))
    smallest = F.least(F.col("a"), F.min("b").over(Window.partitionBy("a")))
    return (
        both.withColumn("m", smallest)
        .where(F.col("b") > F.col("a"))
        .select(F.col("m").alias("a"), "b")
        .distinct()
    )


def _small_star(edges: DataFrame) -> DataFrame:
    """Attach u and its smaller neighbours to the smallest of them, m.

    ``edges``: ``(a, b)`` with a < b (b is u, a a smaller neighbour); so is the result."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    marked = edges.withColumn("m", F.min("a").over(Window.partitionBy("b")))
    attached = marked.where(F.col("a") != F.col("m")).select(
        F.col("m").alias("a"), F.col("a").alias("b")
    )
    centre = marked.select(F.col("m").alias("a"), "b")
    return attached.union(centre).distinct()


def _is_star_forest(edges: DataFrame) -> bool:
    """Whether every component of ``edges`` (a < b) is a star centred on its smallest vertex:
    no vertex is both a centre (an ``a``) and a leaf (a ``b``), no leaf has two centres."""
    from pyspark.sql import functions as F

    both_roles = edges.select("a").intersect(edges.select(F.col("b").alias("a")))
    two_centres = edges.groupBy("b").count().where(F.col("count") > 1).select(F.col("b").alias("a"))
    return both_roles.union(two_centres).isEmpty()


def component_labels(vertices: DataFrame, edges: DataFrame, tick: Tick | None = None) -> DataFrame:
    """``(v, label)``: the smallest vertex id of v's connected component, for every vertex.

    ``vertices``: column ``v``; ``edges``: columns ``a, b`` (undirected, no self-loops).
    Alternates large-star and small-star until the graph is a forest of stars, each centred on
    the smallest vertex of its component (both operations keep the components)."""
    from pyspark.sql import functions as F

    current = edges.select(F.least("a", "b").alias("a"), F.greatest("a", "b").alias("b"))
    current = cut(current.distinct())
    rounds = 0
    while not _is_star_forest(current):
        rounds += 1
        current = cut(_small_star(_large_star(current)))
        if tick:
            tick(f"connected components round {rounds}")
    centres = current.select(F.col("b").alias("v"), F.col("a").alias("label"))
    return vertices.join(centres, "v", "left").select(
        "v", F.coalesce(F.col("label"), F.col("v")).alias("label")
    )


def symmetric_transitive_closure(
    facts: DataFrame, irreflexive: bool, tick: Tick | None = None
) -> DataFrame:
    """``facts``: X as columns ``c0, c1`` (distinct). Returns L (see module docstring)."""
    from pyspark.sql import functions as F

    x = facts.select("c0", "c1")
    vertices = x.select(F.col("c0").alias("v")).union(x.select(F.col("c1").alias("v"))).distinct()
    edges = x.where(F.col("c0") != F.col("c1")).select(
        F.col("c0").alias("a"), F.col("c1").alias("b")
    )
    labels = cut(component_labels(vertices, edges, tick))
    pairs = (
        labels.select(F.col("v").alias("c0"), "label")
        .join(labels.select(F.col("v").alias("c1"), "label"), "label")
        .select("c0", "c1")
    )
    if irreflexive:
        pairs = pairs.where(F.col("c0") != F.col("c1")).union(x.where(F.col("c0") == F.col("c1")))
    return pairs.distinct()
