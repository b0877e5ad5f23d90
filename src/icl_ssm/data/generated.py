"""Tasks generated from a seed, offline: ``coin_flip``, ``modular_addition``, ``edge_existence``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from icl_ssm.data.tasks import Example, Task, positive_int, register

DEFAULT_GENERATED_SIZE = 2100  # enough for the paper's 1500-candidate pool + validation + test


@dataclass
class GeneratedTask(Task):
    """Examples generated from ``seed``; ``size`` distinct examples, labels balanced."""

    size: int = DEFAULT_GENERATED_SIZE
    seed: int = 0

    source = "generated"

    def __post_init__(self) -> None:
        self.size = positive_int(self.size, f"{self.name}: size")
        self.seed = positive_int(self.seed, f"{self.name}: seed", minimum=0)

    def size_hint(self) -> int | None:
        return self.size

    def load(self) -> list[Example]:
        rng = np.random.default_rng(self.seed)
        # balanced labels in a random order; each generator builds an example with that label
        labels = self.labels or ("",)
        targets = [labels[i % len(labels)] for i in range(self.size)]
        order = rng.permutation(self.size)
        out: list[Example] = []
        seen: set[str] = set()
        attempts = 0
        for i in range(self.size):
            target = targets[order[i]]
            while True:
                attempts += 1
                if attempts > 50 * self.size + 1000:
                    raise ValueError(
                        f"{self.name}: could not generate {self.size} distinct examples; ask for a smaller size="
                    )
                text, gold = self.generate(rng, target)
                if text not in seen:
                    break
            seen.add(text)
            out.append(Example(f"{self.name}-{i}", text, gold))
        return out

    def generate(self, rng: np.random.Generator, target: str) -> tuple[str, str]:
        """(input, target) of one example whose target is ``target`` (if labels exist)."""
        raise NotImplementedError  # abstract: each generated task overrides it


_NAMES = (
    "Alice", "Bob", "Carol", "David", "Emma", "Frank", "Grace", "Henry", "Irene", "Jack",
    "Karen", "Liam", "Maria", "Noah", "Olivia", "Paul", "Quinn", "Rosa", "Sam", "Tina",
    "Umar", "Vera", "Walter", "Xena", "Yusuf", "Zoe", "Aiden", "Bella", "Carlos", "Dana",
    "Elena", "Felix", "Gina", "Hugo", "Ines", "Jonas", "Kira", "Leo", "Mila", "Nina",
)  # fmt: skip


@register("coin_flip")
@dataclass
class CoinFlip(GeneratedTask):
    """Coin-flip state tracking (Wei et al., 2022): is the coin still heads up?

    ``min_people``..``max_people`` people each flip or do not flip the coin; the answer is
    "yes" iff the number of flips is even.
    """

    min_people: int = 2
    max_people: int = 4

    labels = ("yes", "no")
    verbalizers = {"yes": "yes", "no": "no"}
    instruction = "Answer whether the coin is still heads up after the people flip it or not."
    input_prefix = "Question: "
    output_prefix = "Answer: "

    def __post_init__(self) -> None:
        super().__post_init__()
        self.min_people = positive_int(self.min_people, "coin_flip: min_people")
        self.max_people = positive_int(self.max_people, "coin_flip: max_people")
        if not self.min_people <= self.max_people <= len(_NAMES):
            raise ValueError(
                f"coin_flip: need min_people <= max_people <= {len(_NAMES)}, got {self.min_people}, {self.max_people}"
            )

    def generate(self, rng: np.random.Generator, target: str) -> tuple[str, str]:
        n = int(rng.integers(self.min_people, self.max_people + 1))
        people = [_NAMES[j] for j in rng.choice(len(_NAMES), size=n, replace=False)]
        flips = [bool(f) for f in rng.integers(0, 2, size=n - 1)]
        flips.append((sum(flips) % 2 == 1) == (target == "yes"))  # parity fixes the answer
        steps = " ".join(
            f"{p} flips the coin." if f else f"{p} does not flip the coin." for p, f in zip(people, flips, strict=True)
        )
        return f"A coin is heads up. {steps} Is the coin still heads up?", target


def _is_prime(n: int) -> bool:
    return n >= 2 and all(n % d for d in range(2, int(n**0.5) + 1))


@register("modular_addition")
@dataclass
class ModularAddition(GeneratedTask):
    """``(a + b) mod p`` for a prime ``p``: a classification task over labels "0".."p-1".

    Classification (not generative) so that every answer is a label whose verbaliser the
    model can be scored on by log-likelihood; ``size`` distinct pairs, at most ``p * p``.
    """

    p: int = 97

    instruction = "Compute the sum of the two numbers modulo the given prime."
    input_prefix = "Input: "
    output_prefix = "Output: "

    def __post_init__(self) -> None:
        super().__post_init__()
        self.p = positive_int(self.p, "modular_addition: p", minimum=2)
        if not _is_prime(self.p):
            raise ValueError(f"modular_addition: p={self.p} is not prime; try 97, 113 or 11")
        if self.size > self.p * self.p:
            raise ValueError(f"modular_addition: size={self.size} but only p*p={self.p * self.p} distinct pairs")
        self.labels = tuple(str(i) for i in range(self.p))
        self.verbalizers = {label: label for label in self.labels}

    def load(self) -> list[Example]:
        # every pair at most once: draw pair indices without replacement
        rng = np.random.default_rng(self.seed)
        pairs = rng.choice(self.p * self.p, size=self.size, replace=False)
        return [
            Example(f"{self.name}-{i}", f"({a} + {b}) mod {self.p}", str((a + b) % self.p))
            for i, (a, b) in enumerate(divmod(int(k), self.p) for k in pairs)
        ]


EDGE_PREAMBLE = "In an undirected graph, (i,j) means that node i and node j are connected with an undirected edge."


def describe_graph(nodes: int, edges: Iterable[tuple[int, int]]) -> str:
    """GraphQA-style text: the node list, then the edge list."""
    node_list = ", ".join(map(str, range(nodes - 1))) + f", and {nodes - 1}"
    edge_list = " ".join(f"({u}, {v})" for u, v in sorted(edges))
    nodes_line = f"{EDGE_PREAMBLE} G describes a graph among nodes {node_list}."
    return f"{nodes_line}\nThe edges in G are: {edge_list}."


@register("edge_existence")
@dataclass
class EdgeExistence(GeneratedTask):
    """Edge existence on random undirected graphs described in text (GraphQA, Fatemi et al.).

    Each graph is G(n, q) with n in ``min_nodes..max_nodes`` and q drawn in [0.2, 0.5];
    half the questions ask about an edge of the graph ("yes"), half about a non-edge.
    """

    min_nodes: int = 5
    max_nodes: int = 12

    labels = ("yes", "no")
    verbalizers = {"yes": "yes", "no": "no"}
    instruction = "Answer whether the graph has an edge between the two given nodes."
    input_prefix = ""
    output_prefix = "Answer: "

    def __post_init__(self) -> None:
        super().__post_init__()
        self.min_nodes = positive_int(self.min_nodes, "edge_existence: min_nodes", minimum=3)
        self.max_nodes = positive_int(self.max_nodes, "edge_existence: max_nodes", minimum=3)
        if self.min_nodes > self.max_nodes:
            raise ValueError(f"edge_existence: min_nodes={self.min_nodes} > max_nodes={self.max_nodes}")

    def generate(self, rng: np.random.Generator, target: str) -> tuple[str, str]:
        import networkx as nx

        n = int(rng.integers(self.min_nodes, self.max_nodes + 1))
        while True:
            graph = nx.gnp_random_graph(n, float(rng.uniform(0.2, 0.5)), seed=int(rng.integers(2**31)))
            edges = sorted((min(u, v), max(u, v)) for u, v in graph.edges())
            non_edges = sorted((min(u, v), max(u, v)) for u, v in nx.non_edges(graph))
            if edges and non_edges:
                break
        candidates = edges if target == "yes" else non_edges
        u, v = candidates[int(rng.integers(len(candidates)))]
        if rng.random() < 0.5:
            u, v = v, u
        question = f"Question: Is there an edge between node {u} and node {v}?"
        return f"{describe_graph(n, edges)}\n{question}", target
