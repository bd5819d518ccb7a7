"""The agents' calculator (docs/wire.md, "agents' tools"): arithmetic parsed with
`ast.parse(expr, mode="eval")` and evaluated by walking an allow-list of nodes. Nothing
is ever passed to eval or exec; names, attributes, subscripts, keywords, strings and
comprehensions are refused. Caps keep every expression cheap: its length, its nesting,
the size of exponents and the magnitude of every intermediate result.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

MAX_CHARS = 500
MAX_DEPTH = 40
MAX_EXPONENT = 10_000
MAX_MAGNITUDE = 1e300
MAX_ARGS = 50

Number = int | float


class CalcError(ValueError):
    """Why an expression cannot be computed, in words the model (and the room) can read."""


CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e}

BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def _sqrt(x: Number) -> Number:
    if x < 0:
        raise CalcError("sqrt of a negative number")
    return math.sqrt(x)


def _log(x: Number, base: Number = math.e) -> Number:
    if x <= 0:
        raise CalcError("log of a number that is not positive")
    if base <= 0 or base == 1:
        raise CalcError("log with a base that is not positive or is 1")
    return math.log(x, base)


def _round(x: Number, digits: Number = 0) -> Number:
    if not isinstance(digits, int) or not -20 <= digits <= 20:
        raise CalcError("round's digits must be a whole number from -20 to 20")
    return round(x, digits) if digits else round(x)


def _min(*xs: Number) -> Number:
    return min(xs)


def _max(*xs: Number) -> Number:
    return max(xs)


# name -> (function, fewest arguments, most arguments)
FUNCTIONS: dict[str, tuple[Callable[..., Number], int, int]] = {
    "sqrt": (_sqrt, 1, 1),
    "abs": (abs, 1, 1),
    "round": (_round, 1, 2),
    "min": (_min, 1, MAX_ARGS),
    "max": (_max, 1, MAX_ARGS),
    "log": (_log, 1, 2),
    "sin": (math.sin, 1, 1),
    "cos": (math.cos, 1, 1),
}

REFUSED: dict[type[ast.AST], str] = {
    ast.Attribute: "attribute access",
    ast.Subscript: "subscripts",
    ast.Lambda: "lambdas",
    ast.Compare: "comparisons",
    ast.BoolOp: "and/or",
    ast.IfExp: "if/else",
    ast.List: "lists",
    ast.Tuple: "tuples",
    ast.Dict: "dicts",
    ast.Set: "sets",
    ast.JoinedStr: "strings",
    ast.NamedExpr: "assignments",
}


def _checked(value: Number) -> Number:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        raise CalcError("the result is not a finite number")
    if abs(value) > MAX_MAGNITUDE:
        raise CalcError("the result is too large (more than 1e300)")
    return value


def _power(base: Number, exponent: Number) -> Number:
    if abs(exponent) > MAX_EXPONENT:
        raise CalcError(f"the exponent is too large (at most {MAX_EXPONENT:,})")
    if base == 0 and exponent < 0:
        raise CalcError("division by zero (0 to a negative power)")
    if abs(base) > 1 and exponent > 0 and exponent * math.log10(abs(base)) > 300:
        raise CalcError("the result is too large (more than 1e300)")
    if base < 0 and isinstance(exponent, float) and not exponent.is_integer():
        raise CalcError("a negative number to a fractional power")
    result = base**exponent
    if isinstance(result, complex):
        raise CalcError("the result is a complex number")
    return result


def _eval(node: ast.AST, depth: int) -> Number:
    if depth > MAX_DEPTH:
        raise CalcError(f"the expression is nested too deeply (at most {MAX_DEPTH} levels)")
    if isinstance(node, ast.Expression):
        return _eval(node.body, depth + 1)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise CalcError(f"not a number: {node.value!r:.40}")
        return _checked(node.value)
    if isinstance(node, ast.Name):
        if node.id in CONSTANTS:
            return CONSTANTS[node.id]
        if node.id in FUNCTIONS:
            raise CalcError(f"{node.id} is a function: call it, e.g. {node.id}(2)")
        raise CalcError(f"unknown name {node.id!r:.40} (known: {', '.join([*CONSTANTS, *FUNCTIONS])})")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _eval(node.operand, depth + 1)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, depth + 1), _eval(node.right, depth + 1)
        try:
            if isinstance(node.op, ast.Pow):
                return _checked(_power(left, right))
            op = BINARY.get(type(node.op))
            if op is None:
                raise CalcError(f"the operator {type(node.op).__name__} is not allowed")
            return _checked(op(left, right))
        except ZeroDivisionError:
            raise CalcError("division by zero") from None
        except OverflowError:
            raise CalcError("the result is too large") from None
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name):
            what = REFUSED.get(type(node.func), type(node.func).__name__)
            raise CalcError(f"not allowed in a calculation: {what}")
        if node.func.id not in FUNCTIONS:
            raise CalcError(f"unknown function {node.func.id!r:.40} (known: {', '.join(FUNCTIONS)})")
        if node.keywords:
            raise CalcError("keyword arguments are not allowed")
        function, fewest, most = FUNCTIONS[node.func.id]
        if not fewest <= len(node.args) <= most:
            raise CalcError(f"{node.func.id} takes {fewest} to {most} arguments, not {len(node.args)}")
        args = [_eval(a, depth + 1) for a in node.args]
        try:
            return _checked(function(*args))
        except (ValueError, OverflowError) as exc:
            if isinstance(exc, CalcError):
                raise
            raise CalcError(f"{node.func.id}: {exc}") from None
    what = REFUSED.get(type(node), type(node).__name__)
    raise CalcError(f"not allowed in a calculation: {what}")


def evaluate(expression: str) -> Number:
    """The value of an arithmetic expression; a CalcError saying why not."""
    if not isinstance(expression, str) or not expression.strip():
        raise CalcError("an empty expression")
    if len(expression) > MAX_CHARS:
        raise CalcError(f"the expression is too long ({len(expression):,} characters, at most {MAX_CHARS})")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise CalcError(f"not an expression: {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError):
        raise CalcError("not an expression") from None
    return _eval(tree, 0)


def format_number(value: Number) -> str:
    """Integers without ".0"; other numbers with up to 15 significant digits."""
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return format(value, ".15g")


def calculate(expression: str) -> str:
    return format_number(evaluate(expression))
