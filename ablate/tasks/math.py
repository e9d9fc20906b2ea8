"""task=math: math word and competition problems, scored by checking the final answer.

Each record has a problem and an answer (optionally a solution, a worked completion used for the warm start), read
by ablate/tasks/records.py from `data_path` (a file, a folder or a hub id; the columns named by `fields`); it defaults
to the small sample kept in the repo (`ablate/tasks/data/math_sample.jsonl`). Repeated problems are kept once and,
with `max_prompt_tokens`, prompts too long dropped (or refused). The splits are a permutation drawn from `task_seed`:
the first `n_val_prompts` problems are held out for validation (or drawn from `val_data_path`, whose problems then
never train), the rest (or the first `n_train_prompts` of them) are for training.

A completion's answer is the last `\\boxed{...}` of its final answer (the text after `</think>`), else its last
number. It is correct when it is mathematically equal to the reference: `math_verify` (Hugging Face's Math-Verify,
package `math-verify`) decides when it is installed, else `sympy_equivalent`, a small LaTeX-to-sympy translation
that covers numbers, fractions, roots, pi and simple expressions. Either way a malformed answer is incorrect, never
an error, and answers too long, too deeply nested or with huge exponents are refused before parsing (parsing
them can take minutes).
"""

from __future__ import annotations

import json
import re
import threading
from functools import lru_cache
from pathlib import Path

import numpy as np
import sympy
from sympy.parsing.sympy_parser import (
    implicit_multiplication,
    parse_expr,
    standard_transformations,
)

from ablate.tasks import records
from ablate.tasks.base import Problem, Task, final_answer

try:
    from math_verify import parse as mv_parse
    from math_verify import verify as mv_verify
except ImportError:  # the sympy fallback checks answers instead
    mv_parse = mv_verify = None

SAMPLE = Path(__file__).parent / "data" / "math_sample.jsonl"
DEFAULT_TEMPLATE = ("Solve the following math problem. Think it through step by step, then write only the final "
                    "answer, as \\boxed{{answer}}.\n\nProblem: {problem}\n<think>\n")
MAX_ANSWER_CHARS = 200
MAX_NESTING = 6  # of (), {} and []: math_verify's parser slows down exponentially with depth
MAX_EXPONENT_DIGITS = 3
MATH_VERIFY_TIMEOUT_S = 5  # math_verify's own timeout uses SIGALRM: only on the main thread


# ---- the data

def read_problems(path: Path) -> list[dict]:
    """The records of a file of `{"problem", "answer"}` (and "solution"), each checked and stripped."""
    return [{"problem": problem, "answer": answer, "solution": solution}
            for problem, answer, solution in _problems(str(path), {}, "train", None)]


def _problems(source: str, fields: dict, split: str, revision: str | None) -> list[tuple]:
    """(problem, answer, solution) of each record of `source`, by the task's field names."""
    unknown = sorted(set(fields) - set(records.FIELDS))
    if unknown:
        raise ValueError(f"task.fields: unknown {unknown}; known: {list(records.FIELDS)} (each names a record's "
                         "column)")
    names = {**{name: name for name in records.FIELDS}, **fields}
    out = []
    for number, record in records.read_records(source, split, revision):
        where = f"task=math: {source}:{number}"
        solution = records.field(record, names["solution"])
        out.append((records.problem_of(record, names["problem"], where),
                    records.answer_of(record, names["answer"], where),
                    solution if isinstance(solution, str) and solution else None))
    return out


def _key(problem) -> str:
    return problem if isinstance(problem, str) else json.dumps(problem)


# ---- the task

class MathTask(Task):
    def __init__(self, tokenizer, data_path: str | None = None, n_train_prompts: int = 0, n_val_prompts: int = 10,
                 prompt_template: str = DEFAULT_TEMPLATE, seed: int = 0, task_seed: int = 1234,
                 warm_start_steps: int = 0, val_data_path: str | None = None, data_split: str = "train",
                 data_revision: str | None = None, fields: dict | None = None, max_prompt_tokens: int = 0,
                 overlong_prompts: str = "drop", **rest: object):
        super().__init__(tokenizer, **rest)  # the prompt's encoding
        self.path = str(Path(data_path).expanduser()) if data_path else str(SAMPLE)
        self.val_path = str(Path(val_data_path).expanduser()) if val_data_path else None
        if n_val_prompts < 0 or n_train_prompts < 0:
            raise ValueError(f"task=math: negative prompt counts ({n_train_prompts}, {n_val_prompts})")
        if overlong_prompts not in ("drop", "error"):
            raise ValueError(f"task.overlong_prompts={overlong_prompts}: drop or error")
        self.template = prompt_template
        self._check_template()
        self.dropped: dict[str, int] = {}  # why -> how many records were left out
        self._longest = 0  # tokens, of the longest prompt dropped for its length
        fields = dict(fields or {})
        train = self._kept(_problems(self.path, fields, data_split, data_revision), max_prompt_tokens,
                           overlong_prompts)
        val = self._kept(_problems(self.val_path, fields, data_split, data_revision), max_prompt_tokens,
                         overlong_prompts) if self.val_path else None
        # The split does not depend on the run's seed: every variant of a sweep sees the same task.
        rng = np.random.default_rng(task_seed)
        if val is None:  # held out of the one file
            n_train = n_train_prompts or len(train) - n_val_prompts
            if n_train <= 0 or n_train + n_val_prompts > len(train):
                raise ValueError(f"task=math: {self.path} has {len(train)} distinct problems{self._after()}; "
                                 f"{n_val_prompts} validation + {n_train_prompts or 'the rest'} training asked")
            self.origin = (f"{self.path} has {len(train):,} distinct problems{self._after()}, and task.n_val_prompts="
                           f"{n_val_prompts:,} of them are held out for validation"
                           + (f", task.n_train_prompts={n_train_prompts:,} kept" if n_train_prompts else ""))
            order = rng.permutation(len(train)).tolist()
            val = [train[i] for i in order[:n_val_prompts]]
            train = [train[i] for i in order[n_val_prompts:n_val_prompts + n_train]]
        else:  # a file of its own: its first n_val_prompts (permuted), and no training problem among them
            if n_val_prompts > len(val) or not n_val_prompts:
                raise ValueError(f"task=math: {self.val_path} has {len(val)} distinct problems{self._after()}; "
                                 f"task.n_val_prompts={n_val_prompts} asked (1 or more)")
            val = [val[i] for i in rng.permutation(len(val))[:n_val_prompts]]
            held = {_key(problem) for problem, _, _ in val}
            before, train = len(train), [record for record in train if _key(record[0]) not in held]
            self._drop("in the validation file", before - len(train))
            n_train = n_train_prompts or len(train)
            if not train or n_train > len(train):
                raise ValueError(f"task=math: {self.path} has {len(train)} distinct problems not in the validation "
                                 f"file{self._after()}; {n_train_prompts or 'the rest'} training asked")
            self.origin = (f"{self.path} has {len(train):,} distinct problems not in the validation file"
                           f"{self._after()}" + (f", task.n_train_prompts={n_train_prompts:,} kept" if n_train_prompts
                                                  else ""))
            train = [train[i] for i in rng.permutation(len(train))[:n_train]]
        self.splits = {"val": [self._problem(p, a) for p, a, _ in val],
                       "train": [self._problem(p, a) for p, a, _ in train]}
        solutions = [solution for _, _, solution in train]
        self._solutions = solutions if all(solutions) else None
        if warm_start_steps > 0 and self._solutions is None:
            raise ValueError(f"task.warm_start_steps={warm_start_steps}: the warm start trains on each training "
                             f"problem's `solution`, and not every problem of {self.path} has one: set it to 0")

    def train_origin(self) -> str:
        return self.origin

    def _kept(self, records: list[tuple], max_prompt_tokens: int, overlong: str) -> list[tuple]:
        """The first record of each problem (a duplicate could otherwise be in both splits), and with
        `max_prompt_tokens`, only those whose prompt fits it (or an error, with overlong='error')."""
        seen: dict[str, tuple] = {}
        for record in records:
            seen.setdefault(_key(record[0]), record)
        self._drop("repeated", len(records) - len(seen))
        kept = list(seen.values())
        if max_prompt_tokens > 0:
            lengths = [len(self.encode_prompt(self._problem(p, a).prompt)) for p, a, _ in kept]
            over = [length for length in lengths if length > max_prompt_tokens]
            if over and overlong == "error":
                raise ValueError(f"task=math: {len(over)} prompts are longer than generation.max_prompt_tokens="
                                 f"{max_prompt_tokens} (the longest {max(over):,} tokens): raise it, or drop them "
                                 f"with task.overlong_prompts=drop")
            kept = [record for record, length in zip(kept, lengths) if length <= max_prompt_tokens]
            self._drop(f"over {max_prompt_tokens:,} prompt tokens", len(over))
            self._longest = max([self._longest, *over])
        return kept

    def _drop(self, why: str, count: int) -> None:
        if count:
            self.dropped[why] = self.dropped.get(why, 0) + count

    def _after(self) -> str:
        if not self.dropped:
            return ""
        hint = f" (the longest {self._longest:,} tokens: raise generation.max_prompt_tokens)" if self._longest else ""
        return f" after dropping {', '.join(f'{n:,} {why}' for why, n in self.dropped.items())}{hint}"

    def _check_template(self) -> None:
        try:
            self.template.format(problem="")
        except (KeyError, IndexError, ValueError) as error:
            raise ValueError(f"task.prompt_template: must name only {{problem}} and double every other brace "
                             f"({{{{ }}}}): {error!r}") from None

    def _problem(self, problem, answer: str) -> Problem:
        """A text problem goes through the prompt template; a conversation goes as it is (its last turn the user's)."""
        if not isinstance(problem, str):
            if not self.chat_template:
                raise ValueError("task=math: the data's problems are conversations (lists of turns): set "
                                 "task.chat_template=true to render them with the tokenizer's template")
            return Problem(prompt=problem, answer=answer)
        return Problem(prompt=self.template.format(problem=problem), answer=answer)

    def correct(self, completion: str, problem: Problem) -> bool:
        answer = extract_answer(final_answer(completion))
        return answer is not None and equivalent(answer, problem.answer)

    def warm_start_example(self, index: int) -> tuple[str, str] | None:
        """(prompt, solution) of training problem `index` (cycling), when every one has a `solution`; else None."""
        if self._solutions is None:
            return None
        i = index % len(self._solutions)
        return self.splits["train"][i].prompt, self._solutions[i]


# ---- finding the answer in a completion

BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|-?\.\d+")


def extract_answer(text: str) -> str | None:
    """The content of the last complete `\\boxed{...}` (nested braces kept); else the last number; else None."""
    boxes = list(BOXED.finditer(text))
    for box in reversed(boxes):
        content = _braced(text, box.end() - 1)
        if content is not None:
            return content.strip()
    if boxes:  # boxed but never closed (cut off): no answer
        return None
    numbers = NUMBER.findall(text)
    return numbers[-1] if numbers else None


def _braced(text: str, start: int) -> str | None:
    """The text inside the brace group opening at text[start] == "{", or None when it never closes."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1:i]
    return None


# ---- deciding whether two answers are equal

def equivalent(answer: str, reference: str) -> bool:
    """Whether `answer` equals `reference` mathematically (math_verify when installed, else sympy). Never raises."""
    answer, reference = clean(answer), clean(reference)
    if answer == reference:
        return bool(answer)
    check = math_verify_equivalent if mv_verify is not None else sympy_equivalent
    return check(answer, reference)


def clean(answer: str) -> str:
    """Drop what never changes the value: $ signs, spacing, \\left/\\right, %, degrees, units, a leading `x =`."""
    text = answer.strip().strip("$").strip()
    text = re.sub(r"\\(?:left|right|displaystyle|[,;:! ])", "", text)
    text = re.sub(r"\^\s*\{?\\circ\}?|\\%|%|\\\$", "", text)
    text = text.replace("{,}", ",").replace("**", "^").replace(r"\dfrac", r"\frac").replace(r"\tfrac", r"\frac")
    text = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", text)  # thousands separators: 1,000 -> 1000
    without_text = re.sub(r"\\(?:text|textbf|mathrm|mbox)\s*\{[^{}]*\}", "", text).strip()
    text = without_text or re.sub(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}", r"\1", text)  # units go
    text = re.sub(r"^[A-Za-z]\s*=(?!=)", "", text)
    return text.strip().rstrip(".").strip()


def parseable(answer: str) -> bool:
    """Short and shallow, with no tower of exponents, no exponent of more than MAX_EXPONENT_DIGITS digits and no
    factorial of a number that long: what could keep a parser busy for minutes."""
    if len(answer) > MAX_ANSWER_CHARS or _depth(answer) > MAX_NESTING:
        return False
    if re.search(rf"\d{{{MAX_EXPONENT_DIGITS + 1}}}\s*!", answer):
        return False
    for caret in re.finditer(r"\^", answer):
        rest = answer[caret.end():].lstrip()
        exponent = _braced(rest, 0) if rest.startswith("{") else re.match(r"-?\d*\.?\d*|.?", rest).group()
        if exponent is None:
            return False
        after = rest[len(exponent) + 2 if rest.startswith("{") else len(exponent):].lstrip()
        if "^" in exponent or after.startswith("^") or re.search(rf"\d{{{MAX_EXPONENT_DIGITS + 1}}}", exponent):
            return False
    return True


def _depth(text: str) -> int:
    depth = deepest = 0
    for char in text:
        depth += 1 if char in "({[" else -1 if char in ")}]" else 0
        deepest = max(deepest, depth)
    return deepest


def math_verify_equivalent(answer: str, reference: str) -> bool:
    """Math-Verify's verdict on two cleaned answers, each parsed as `$\\boxed{...}$`. False when it cannot say, and
    when the answer (from a completion; the reference is trusted) is not `parseable`."""
    if not parseable(answer):
        return False
    try:
        gold, guess = _mv_parsed(reference, _timeout()), _mv_parsed(answer, _timeout())
        return bool(gold and guess and mv_verify(list(gold), list(guess), timeout_seconds=_timeout()))
    except Exception:  # noqa: BLE001 - a completion that breaks the parser is wrong, never an error
        return False


@lru_cache(maxsize=4096)
def _mv_parsed(text: str, timeout: int | None) -> tuple:
    return tuple(mv_parse(f"$\\boxed{{{text}}}$", parsing_timeout=timeout))


def _timeout() -> int | None:
    """math_verify's timeout installs a SIGALRM handler, which only the main thread may: none elsewhere."""
    return MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


# ---- the sympy fallback

SYMPY_NAMES = {"sqrt", "pi"}
LATEX_COMMANDS = {"cdot": "*", "times": "*", "div": "/", "pi": " pi "}


def sympy_equivalent(answer: str, reference: str) -> bool:
    """Whether two cleaned answers have the same value under sympy: exactly for exact numbers and expressions, to
    1e-6 when either is a decimal (0.333333 == 1/3, 0.333 != 1/3). False when either does not parse, and when the
    answer (from a completion; the reference is trusted) is not `parseable`."""
    if not parseable(answer):
        return False
    try:
        a, b = to_sympy(answer), to_sympy(reference)
        if a is None or b is None:
            return False
        if a.free_symbols or b.free_symbols or not (a.has(sympy.Float) or b.has(sympy.Float)):
            return sympy.simplify(a - b) == 0
        return bool(abs(sympy.N(a - b)) <= 1e-6)
    except Exception:  # noqa: BLE001 - e.g. a comparison sympy cannot decide: not shown equal
        return False


def to_sympy(answer: str):
    """A sympy expression for a cleaned LaTeX-ish or plain answer (\\frac{1}{2}, 1/2, 0.5, 2\\sqrt{2}, 3\\pi, 2^{10},
    x+1), or None. Only digits, operators, brackets, single-letter variables, sqrt and pi get to the parser."""
    try:
        text = _latex_to_python(answer)
    except ValueError:
        return None
    names = set(re.findall(r"[A-Za-z]+", text))
    if not re.fullmatch(r"[\d\sA-Za-z+\-*/().]+", text) or any(len(n) > 1 and n not in SYMPY_NAMES for n in names):
        return None
    allowed = {"Integer": sympy.Integer, "Float": sympy.Float, "Rational": sympy.Rational, "Symbol": sympy.Symbol,
               "sqrt": sympy.sqrt, "pi": sympy.pi}
    try:
        value = parse_expr(text, local_dict={}, global_dict=allowed,
                           transformations=standard_transformations + (implicit_multiplication,))
    except Exception:  # noqa: BLE001 - parse_expr raises anything from SyntaxError to TypeError
        return None
    return value if isinstance(value, sympy.Expr) and not value.has(sympy.zoo, sympy.nan, sympy.oo) else None


def _latex_to_python(text: str) -> str:
    """\\frac{a}{b} -> ((a)/(b)), \\sqrt[n]{x} -> ((x)**(1/(n))), \\sqrt{x} -> sqrt(x), ^ -> **, {} -> (), \\cdot -> *.
    Raises ValueError on an unknown command or an unclosed group."""
    out, i = [], 0
    while i < len(text):
        command = re.match(r"\\([A-Za-z]+)", text[i:])
        if command is None:
            out.append({"{": "(", "}": ")", "^": "**"}.get(text[i], text[i]))
            i += 1
            continue
        name, i = command.group(1), i + command.end()
        if name == "frac":
            numerator, i = _argument(text, i)
            denominator, i = _argument(text, i)
            out.append(f"(({_latex_to_python(numerator)})/({_latex_to_python(denominator)}))")
        elif name == "sqrt":
            index = None
            if text[i:i + 1] == "[":
                close = text.index("]", i)  # ValueError when unclosed
                index, i = text[i + 1:close], close + 1
            body, i = _argument(text, i)
            body = _latex_to_python(body)
            out.append(f"sqrt({body})" if index is None else f"(({body})**(1/({_latex_to_python(index)})))")
        elif name in LATEX_COMMANDS:
            out.append(LATEX_COMMANDS[name])
        else:
            raise ValueError(f"unknown command \\{name}")
    return "".join(out)


def _argument(text: str, i: int) -> tuple[str, int]:
    """The argument of a command at text[i:]: a brace group, or one character (\\frac12), and where it ends."""
    while i < len(text) and text[i].isspace():
        i += 1
    if i >= len(text):
        raise ValueError("missing argument")
    if text[i] != "{":
        return text[i], i + 1
    inside = _braced(text, i)
    if inside is None:
        raise ValueError("unclosed group")
    return inside, i + len(inside) + 2
