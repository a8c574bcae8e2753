"""English-ish text made up on the spot, for the tokenizer's corpus and the generated data. It need mean nothing,
but it looks like English (common words, a long tail of made-up ones) so that a BPE trained on it behaves like a
real one. Bump ``TEXT_RECIPE`` whenever the output changes: every cached asset's spec holds it.
"""

from __future__ import annotations

import bisect
import itertools
import random

TEXT_RECIPE = "lab-text-v1"

# Roughly by frequency in English prose; sampled with Zipf weights in this order.
COMMON_WORDS: tuple[str, ...] = tuple(
    dict.fromkeys(
        """
    the of and to a in is that it for as with was on be by this are or from at an which but not have
    can has they their more one you we will all also there been other when if its these so about into
    than may some would only were what such each used new time many most how any two first like through
    between over well both use make people way very could even after where should under same do because
    while these each those then them data often model number water part system first small large
    important example different process world information form power order work example result group
    point value case problem change level however each area year state type high set need provide help
    include three user language energy light simple common early several long best write list describe
    explain answer question text following given sentence word words story summary poem letter idea
    plan method step steps reason reasons benefit benefits way ways rule rules team student students
    teacher book city country food health science history music art game family friend day night
    house school market company product customer service price money business research study design
    build create keep find give take show tell ask feel think know learn grow move play read run turn
    live call start seem hold bring happen begin stay lead understand follow stop speak open spend
    good great old right big high different little local social national public able main strong
    clear short simple whole free certain recent possible personal natural special easy hard human
    real full major better true available likely current specific positive negative modern green
    quickly usually always never often sometimes together already almost really still again later
    """.split()
    )
)

INSTRUCTION_VERBS: tuple[str, ...] = (
    "Write",
    "Explain",
    "Describe",
    "Summarize",
    "List",
    "Give",
    "Classify",
    "Rewrite",
    "Suggest",
    "Identify",
    "Compare",
    "Create",
    "Generate",
    "Find",
    "Name",
    "Edit",
    "Translate",
    "Outline",
)
QUESTION_OPENERS: tuple[str, ...] = ("What is", "How does", "Why do", "What are", "How can", "Which")

_ONSETS = "b br c ch cl d dr f fl g gr h j k l m n p pl pr r s sh sl st str t th tr v w y z".split() + [""]
_NUCLEI = "a e i o u a e i o ai ea ee oo ou ie".split()
_CODAS = "n r l s t nd st ck ng m sh rt ll x".split() + ["", "", ""]
_SUFFIXES = "ing ed er ly tion ness ment able ous ity al ive".split() + [""] * 12

_LEXICON_SEED = 20240601
_LEXICON_SIZE = 3000
_P_COMMON = 0.72


def _make_lexicon() -> tuple[str, ...]:
    """A fixed list of made-up words, built once from a fixed seed so every run sees the same words."""
    rng = random.Random(_LEXICON_SEED)
    seen: set[str] = set(COMMON_WORDS)
    words: list[str] = []
    while len(words) < _LEXICON_SIZE:
        n_syllables = rng.choices((1, 2, 3, 4), weights=(3, 5, 3, 1))[0]
        word = "".join(rng.choice(_ONSETS) + rng.choice(_NUCLEI) + rng.choice(_CODAS) for _ in range(n_syllables))
        word += rng.choice(_SUFFIXES)
        if 2 <= len(word) <= 16 and word not in seen:
            seen.add(word)
            words.append(word)
    return tuple(words)


LEXICON: tuple[str, ...] = _make_lexicon()


def _zipf_cum_weights(n: int, exponent: float = 1.0) -> list[float]:
    return list(itertools.accumulate(1.0 / (rank + 1) ** exponent for rank in range(n)))


_COMMON_CUM = _zipf_cum_weights(len(COMMON_WORDS))
_LEXICON_CUM = _zipf_cum_weights(len(LEXICON), 0.9)


def word(rng: random.Random) -> str:
    """One word: usually a common English word, otherwise a made-up one, both Zipf-distributed."""
    # bisect by hand: what random.choices does, without its per-call overhead (this is the hot loop)
    if rng.random() < _P_COMMON:
        return COMMON_WORDS[bisect.bisect(_COMMON_CUM, rng.random() * _COMMON_CUM[-1], 0, len(_COMMON_CUM) - 1)]
    return LEXICON[bisect.bisect(_LEXICON_CUM, rng.random() * _LEXICON_CUM[-1], 0, len(_LEXICON_CUM) - 1)]


def words(rng: random.Random, n: int) -> list[str]:
    return [word(rng) for _ in range(n)]


def sentence(rng: random.Random, n_words: int, *, end: str = ".") -> str:
    """A capitalised sentence of exactly ``n_words`` words, with the odd comma."""
    ws = words(rng, max(1, n_words))
    ws[0] = ws[0].capitalize()
    for i in range(3, len(ws) - 2):
        if rng.random() < 0.06:
            ws[i] += ","
    return " ".join(ws) + end


def paragraph(rng: random.Random, n_words: int) -> str:
    """About ``n_words`` words as sentences of 5-22 words; sometimes a numbered list, as Alpaca outputs are."""
    n_words = max(1, n_words)
    lengths: list[int] = []
    left = n_words
    while left > 0:
        k = min(left, rng.randint(5, 22))
        if 0 < left - k < 3:  # no stub sentences at the end
            k = left
        lengths.append(k)
        left -= k
    sentences = [sentence(rng, k) for k in lengths]
    if len(sentences) >= 3 and rng.random() < 0.2:
        return "\n".join(f"{i}. {s}" for i, s in enumerate(sentences, 1))
    return " ".join(sentences)


def instruction(rng: random.Random, n_words: int) -> str:
    """An imperative or a question, as Alpaca instructions are."""
    n_words = max(2, n_words)
    if rng.random() < 0.25:
        opener = rng.choice(QUESTION_OPENERS)
        rest = max(1, n_words - len(opener.split()))
        return f"{opener} " + " ".join(words(rng, rest)) + "?"
    verb = rng.choice(INSTRUCTION_VERBS)
    return f"{verb} " + " ".join(words(rng, n_words - 1)) + "."


def corpus(rng: random.Random, n_lines: int) -> list[str]:
    """Lines for training the tokenizer: sentences, instructions, numbers and a little code-like text."""
    lines: list[str] = []
    for i in range(n_lines):
        kind = i % 10
        if kind < 6:
            lines.append(paragraph(rng, rng.randint(8, 60)))
        elif kind < 8:
            lines.append(instruction(rng, rng.randint(4, 20)))
        elif kind == 8:
            lines.append(
                f"{rng.randint(0, 10_000)} {word(rng)} = {rng.random():.3f}; "
                f"({word(rng)}, {rng.randint(1, 99)}%) - {word(rng)}: {rng.randint(1900, 2030)}!"
            )
        else:
            lines.append(sentence(rng, rng.randint(3, 12), end=rng.choice(("?", "!", ".", ":", ";"))))
    return lines
