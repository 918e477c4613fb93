"""A seeded, templated four-topic text-classification task (generated, nothing downloaded).

Each sentence puts a topic noun and a shared adjective into a sentence frame, with optional
distractor words. Training and test sentences use disjoint frames, so the frame cannot
reveal the label; the topic noun (drawn from class-specific lists) must be read.
"""

from __future__ import annotations

import random

LABELS = ("sports", "weather", "food", "money")
NOUNS = {
    "sports": ["match", "goalkeeper", "tournament", "coach", "stadium", "referee", "striker"],
    "weather": ["storm", "rain", "forecast", "snowfall", "breeze", "thunder", "fog"],
    "food": ["soup", "bakery", "dessert", "recipe", "sandwich", "chef", "noodles"],
    "money": ["loan", "stock", "budget", "salary", "invoice", "bank", "mortgage"],
}
ADJECTIVES = ["great", "strange", "long", "quiet", "terrible", "surprising", "new", "usual"]
DISTRACTORS = ["honestly", "again", "perhaps", "really", "today", "somehow", "still"]
TRAIN_FRAMES = [
    "yesterday the {n} was really {a}",
    "my friend said the {n} looked {a}",
    "i think that {n} is {a}",
    "everyone noticed the {a} {n} this morning",
    "the {n} seemed {a} to me",
    "we talked about the {a} {n} for hours",
]
TEST_FRAMES = [
    "honestly the {n} felt {a} this week",
    "nobody expected such a {a} {n}",
    "they wrote a note about the {n} being {a}",
]


def make_sentences(n: int, *, test: bool, seed: int) -> tuple[list[str], list[int]]:
    """``n`` sentences and labels from the train or test frames, reproducible by ``seed``."""
    rng = random.Random(seed * 2 + int(test))
    frames = TEST_FRAMES if test else TRAIN_FRAMES
    texts, labels = [], []
    for _ in range(n):
        label = rng.randrange(len(LABELS))
        text = rng.choice(frames).format(
            n=rng.choice(NOUNS[LABELS[label]]), a=rng.choice(ADJECTIVES)
        )
        if rng.random() < 0.5:
            words = text.split()
            words.insert(rng.randrange(len(words) + 1), rng.choice(DISTRACTORS))
            text = " ".join(words)
        texts.append(text)
        labels.append(label)
    return texts, labels
