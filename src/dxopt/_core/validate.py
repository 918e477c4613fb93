"""Argument validators shared by every subpackage.

Each raises ``ValueError`` / ``TypeError`` with a message that names the argument, says what
was expected and what came, and (through ``hint``) what to do.
"""

from __future__ import annotations

import contextlib
import functools
import math
import numbers
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import numpy as np
import torch

__all__ = [
    "check_callable",
    "check_choice",
    "check_int",
    "check_positive",
    "check_range",
    "check_tensor",
    "input_errors",
    "positional_deprecated",
    "positional_refused",
    "renamed_kwargs",
]

T = TypeVar("T")


def _tail(hint: str) -> str:
    return f"; {hint}" if hint else "."


def _is_real(value: object) -> bool:
    """Python and NumPy real scalars (not bools, not tensors)."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def check_positive(name: str, value: Any, *, allow_zero: bool = False, hint: str = "") -> float:
    """Require a finite real number ``> 0`` (``>= 0`` with ``allow_zero``); returns it as float."""
    ok = _is_real(value) and math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        what = "non-negative" if allow_zero else "positive"
        raise ValueError(f"{name}: expected a {what} finite number, got {value!r}{_tail(hint)}")
    return float(value)


def check_range(
    name: str,
    value: Any,
    low: float,
    high: float,
    *,
    closed: tuple[bool, bool] = (True, False),
    hint: str = "",
) -> float:
    """Require a real number in ``[low, high)`` (ends chosen by ``closed``)."""
    ok = _is_real(value) and math.isfinite(value)
    if ok:
        ok = (value >= low if closed[0] else value > low) and (
            value <= high if closed[1] else value < high
        )
    if not ok:
        interval = f"{'[' if closed[0] else '('}{low}, {high}{']' if closed[1] else ')'}"
        raise ValueError(f"{name}: expected a number in {interval}, got {value!r}{_tail(hint)}")
    return float(value)


def check_int(name: str, value: Any, *, minimum: int = 1, hint: str = "") -> int:
    """Require an integer (not a bool) ``>= minimum``."""
    if (
        isinstance(value, (bool, np.bool_))
        or not isinstance(value, numbers.Integral)
        or value < minimum
    ):
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value!r}{_tail(hint)}")
    return int(value)


def check_choice(name: str, value: Any, choices: Iterable[T], *, hint: str = "") -> T:
    """Require ``value`` to be one of ``choices``."""
    options = tuple(choices)
    if value not in options:
        listed = ", ".join(repr(c) for c in options)
        raise ValueError(f"{name}: expected one of {listed}, got {value!r}{_tail(hint)}")
    return value


def check_callable(name: str, value: Any, *, signature: str = "", hint: str = "") -> None:
    """Require a callable (``signature`` describes the expected call in the message)."""
    if not callable(value):
        what = f"a callable {signature}" if signature else "a callable"
        raise TypeError(f"{name}: expected {what}, got {type(value).__name__}{_tail(hint)}")


def check_tensor(
    name: str,
    value: Any,
    *,
    ndim: int | None = None,
    shape: tuple[int, ...] | None = None,
    dtype: torch.dtype | None = None,
    floating: bool = False,
    finite: bool = False,
    hint: str = "",
) -> torch.Tensor:
    """Require a tensor with the given ``ndim`` / ``shape`` / ``dtype`` (or any floating
    dtype with ``floating``) and, with ``finite``, no NaN or infinity."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(value).__name__}{_tail(hint)}")
    if ndim is not None and value.ndim != ndim:
        raise ValueError(
            f"{name}: expected a {ndim}-D tensor, got shape {tuple(value.shape)}{_tail(hint)}"
        )
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise ValueError(
            f"{name}: expected shape {tuple(shape)}, got {tuple(value.shape)}{_tail(hint)}"
        )
    if dtype is not None and value.dtype != dtype:
        raise ValueError(
            f"{name}: expected dtype {dtype}, got {value.dtype}"
            f"{_tail(hint or f'cast it with .to({dtype})')}"
        )
    if floating and not value.dtype.is_floating_point:
        raise TypeError(
            f"{name}: expected a floating-point tensor, got dtype {value.dtype}"
            f"{_tail(hint or 'cast it with .double() or .float()')}"
        )
    if finite and not bool(torch.isfinite(value).all()):
        raise ValueError(f"{name}: expected finite values, got NaN or infinity{_tail(hint)}")
    return value


F = TypeVar("F", bound=Callable[..., Any])


def renamed_kwargs(**renames: str) -> Callable[[F], F]:
    """Accept the old keyword names ``old=new`` for one release, with a DeprecationWarning.

    Works on functions and on classes (wrapping ``__init__``, e.g. of a dataclass). Passing
    both the old and the new name is a ``TypeError``.
    """

    def decorate(obj: F) -> F:
        target = obj.__init__ if isinstance(obj, type) else obj  # type: ignore[misc]
        owner = obj.__qualname__

        @functools.wraps(target)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in renames.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(
                            f"{owner}: got both {old!r} and its new name {new!r}; "
                            f"pass only {new!r}."
                        )
                    warnings.warn(
                        f"{owner}: the keyword {old!r} is renamed {new!r} and the old name will "
                        "be removed in the next release.",
                        DeprecationWarning,
                        stacklevel=2,
                    )
                    kwargs[new] = kwargs.pop(old)
            return target(*args, **kwargs)

        if isinstance(obj, type):
            obj.__init__ = wrapper  # type: ignore[misc]
            return obj
        return wrapper  # type: ignore[return-value]

    return decorate


def positional_deprecated(
    *names: str, leading: int, note: str = "", stacklevel: int = 2
) -> Callable[[F], F]:
    """Accept the keyword-only parameters ``names`` positionally for one release, with a
    DeprecationWarning naming the arguments that were bound.

    ``leading`` is the number of positional parameters the function keeps (``self`` counts);
    positional arguments past them are bound to ``names`` in order. Too many positional
    arguments, or one also passed by keyword, is a ``TypeError``. ``note`` ends the warning
    (e.g. why the order is a trap); ``stacklevel`` points the warning at the caller (2: the
    caller of the decorated function).
    """

    def decorate(fn: F) -> F:
        owner = fn.__qualname__

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if len(args) <= leading:  # the normal call: nothing to do
                return fn(*args, **kwargs)
            extra = args[leading:]
            if len(extra) > len(names):
                raise TypeError(
                    f"{owner}: expected at most {leading + len(names)} positional arguments, "
                    f"got {len(args)}; pass the options by keyword."
                )
            bound = names[: len(extra)]
            both = [name for name in bound if name in kwargs]
            if both:
                raise TypeError(
                    f"{owner}: got {both[0]!r} both positionally and by keyword; pass it by "
                    "keyword only."
                )
            listed = ", ".join(bound)
            by_keyword = ", ".join(f"{name}=..." for name in bound)
            warnings.warn(
                f"{owner}: {len(extra)} argument(s) after the first {leading} were passed "
                f"positionally and bound, in order, to {listed}; these parameters are "
                f"keyword-only and positional use will be an error in the next release. Pass "
                f"them by keyword ({by_keyword}).{f' {note}' if note else ''}",
                DeprecationWarning,
                stacklevel=stacklevel,
            )
            kwargs.update(zip(bound, extra))
            return fn(*args[:leading], **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


def positional_refused(*names: str, leading: int, note: str = "") -> Callable[[F], F]:
    """Refuse the keyword-only parameters ``names`` given positionally, with a ``TypeError``
    that names the parameters the extra arguments would have been bound to and says to pass
    them by keyword (the end of :func:`positional_deprecated`'s release of warning).

    ``leading`` is the number of positional parameters the function keeps (``self`` counts);
    ``note`` ends the message (e.g. why the order is a trap). The wrapper costs one ``len``
    on the normal call.
    """

    def decorate(fn: F) -> F:
        owner = fn.__qualname__

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if len(args) <= leading:  # the normal call
                return fn(*args, **kwargs)
            extra = len(args) - leading
            bound = names[:extra] if extra <= len(names) else names
            by_keyword = ", ".join(f"{name}=" for name in bound)
            raise TypeError(
                f"{owner}: expected {leading} positional argument(s), got {len(args)}; "
                f"the parameters after them ({', '.join(names)}) are keyword-only. Pass them "
                f"by keyword ({by_keyword}...).{f' {note}' if note else ''}"
            )

        return wrapper  # type: ignore[return-value]

    return decorate


@contextlib.contextmanager
def input_errors(
    value_error: type[ValueError] = ValueError, type_error: type[TypeError] = TypeError
) -> Iterator[None]:
    """Re-raise the ``ValueError`` / ``TypeError`` of the validators inside the block as a
    subpackage's own input errors (same message), e.g.
    ``with input_errors(RLValueError, RLTypeError): check_int("num_attempts", k)``.

    Errors that already have the requested type pass through unchanged."""
    try:
        yield
    except (value_error, type_error):
        raise
    except TypeError as err:
        raise type_error(str(err)) from None
    except ValueError as err:
        raise value_error(str(err)) from None
