"""An embedded parallel corpus worth learning, for ``transduce quickstart``: human-readable dates -> ISO 8601.

Each source is a date written in one of many English surface forms ("Tuesday, the 3rd of March 1998", "3/3/98",
"march third, nineteen ninety-eight", ...); the target is ``1998-03-03``. The task needs real reordering (day and
month come before the year in most forms, the ISO target starts with the year), number words, ordinals,
abbreviations and two-digit years, so the encoder-decoder attention picture shows the model looking back and forth.
"""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path

MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
ONES = ["", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
TEENS = ["ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
ORDINAL_WORDS = {
    "one": "first",
    "two": "second",
    "three": "third",
    "five": "fifth",
    "eight": "eighth",
    "nine": "ninth",
    "twelve": "twelfth",
}

FIRST_DAY, LAST_DAY = dt.date(1900, 1, 1), dt.date(2099, 12, 31)


def number_words(n: int) -> str:
    """0 < n < 100 in English words: 21 -> 'twenty-one'."""
    if n < 10:
        return ONES[n]
    if n < 20:
        return TEENS[n - 10]
    tens, ones = divmod(n, 10)
    return TENS[tens] + (f"-{ONES[ones]}" if ones else "")


def ordinal_words(n: int) -> str:
    """1 <= n <= 31 as an ordinal word: 3 -> 'third', 21 -> 'twenty-first', 20 -> 'twentieth'."""
    words = number_words(n)
    head, _, last = words.rpartition("-")
    if last in ORDINAL_WORDS:
        last = ORDINAL_WORDS[last]
    elif last.endswith("y"):
        last = last[:-1] + "ieth"
    else:
        last += "th"
    return f"{head}-{last}" if head else last


def ordinal_suffix(n: int) -> str:
    """3 -> '3rd', 11 -> '11th', 22 -> '22nd'."""
    if 10 <= n % 100 <= 20:
        return f"{n}th"
    return f"{n}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th') }"


def year_words(y: int) -> str:
    """1998 -> 'nineteen ninety-eight', 2005 -> 'two thousand five', 1900 -> 'nineteen hundred'."""
    century, rest = divmod(y, 100)
    if century == 20 and rest < 10:
        return "two thousand" + (f" {ONES[rest]}" if rest else "")
    if rest == 0:
        return f"{number_words(century)} hundred"
    if rest < 10:
        return f"{number_words(century)} oh {ONES[rest]}"
    return f"{number_words(century)} {number_words(rest)}"


def surface_forms(d: dt.date) -> list[str]:
    """Every way this corpus writes the date ``d`` (two-digit years only where they are unambiguous here: 1950-2049)."""
    month, mon = MONTHS[d.month - 1], MONTHS[d.month - 1][:3]
    day, year, weekday = d.day, d.year, WEEKDAYS[d.weekday()]
    forms = [
        f"{month} {day}, {year}",
        f"{day} {month} {year}",
        f"the {ordinal_suffix(day)} of {month} {year}",
        f"{weekday}, {month} {day}, {year}",
        f"{weekday}, the {ordinal_suffix(day)} of {month}, {year}",
        f"{mon} {day} {year}",
        f"{day} {mon}. {year}",
        f"{ordinal_suffix(day)} {month} {year}",
        f"{d.month}/{day}/{year}",
        f"{day}.{d.month}.{year}",
        f"{month} {ordinal_words(day)}, {year_words(year)}",
        f"the {ordinal_words(day)} of {month.lower()}, {year_words(year)}",
        f"{year} {month} {day}",
        f"{weekday.lower()} {day} {mon.lower()} {year}",
    ]
    if 1950 <= year <= 2049:
        forms += [f"{d.month}/{day}/{year % 100:02d}", f"{month} {day}, '{year % 100:02d}"]
    return forms


def make_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` (source, target) pairs drawn uniformly over dates 1900-2099 and over surface forms."""
    rng = random.Random(seed)
    span = (LAST_DAY - FIRST_DAY).days
    pairs = []
    for _ in range(n):
        d = FIRST_DAY + dt.timedelta(days=rng.randrange(span + 1))
        pairs.append((rng.choice(surface_forms(d)), d.isoformat()))
    return pairs


SRC_SUFFIX, TGT_SUFFIX = "date", "iso"  # file suffixes, in the places of language codes


def write_corpus(directory: str | Path, *, train: int = 30000, valid: int = 500, test: int = 1000, seed: int = 1):
    """Write ``train``/``valid``/``test`` splits as ``{split}.date`` / ``{split}.iso`` text files. Test and valid
    pairs are drawn with other seeds; a (source, target) pair that occurs in the training split is redrawn, so
    held-out scores measure generalisation rather than memory.

    Returns:
        the directory, as a Path.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    train_pairs = make_pairs(train, seed)
    seen = set(train_pairs)
    splits = {"train": train_pairs}
    for offset, (name, size) in enumerate((("valid", valid), ("test", test)), start=1):
        held_out, k = [], 0
        while len(held_out) < size:
            for pair in make_pairs(size, seed + 1000 * offset + k):
                if pair not in seen and len(held_out) < size:
                    held_out.append(pair)
                    seen.add(pair)
            k += 1
        splits[name] = held_out
    for name, pairs in splits.items():
        (directory / f"{name}.{SRC_SUFFIX}").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
        (directory / f"{name}.{TGT_SUFFIX}").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    return directory
