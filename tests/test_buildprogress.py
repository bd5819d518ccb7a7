"""What `make run` shows while it builds llama.cpp (collab/buildprogress.py, README "Set
up"): pip's steps, scikit-build-core's stages and the build's own step counter, none of
the compiler's or CMake's chatter; the whole output kept in the log; a failure's last lines.

tests/llama_build_excerpt.log is cut from a real `pip wheel -v llama-cpp-python==0.3.36`
on this project's machine (its pip preamble, CMake's configure, a few of the 193 build
steps with the compiler warnings between them, and its end), run through the real filter
by a real child process.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

from collab.buildprogress import Progress, lines_of, run, step_label

EXCERPT = Path(__file__).with_name("llama_build_excerpt.log")

SHOWN = [
    "Collecting llama-cpp-python==0.3.36",
    "  Downloading llama_cpp_python-0.3.36.tar.gz (76.6 MB)",
    "  Installing build dependencies: started",
    "  Installing build dependencies: finished with status 'done'",
    "  *** scikit-build-core 1.1.2 using CMake 3.25.1 (metadata_wheel)",
    "Building wheels for collected packages: llama-cpp-python",
    "  Building wheel for llama-cpp-python (pyproject.toml): started",
    "  *** scikit-build-core 1.1.2 using CMake 3.25.1 (wheel)",
    "  *** Configuring CMake...",
    "  *** Building project with Ninja...",
    "  [1/193] ggml.cpp.o",
    "  [2/193] ggml-alloc.c.o",
    "  [16/193] libggml-base.so.0.25.3",
    "  [19/193] amx.cpp.o",
    "  [20/193] mmq.cpp.o",
    "  [21/193] tiled-kernel.cpp.o",
    "  [80/193] libvendor-hash.a",
    "  [192/193] libmtmd.so.0.5.0",
    "  [193/193] libmtmd.so.0.5.0",
    "  *** Installing project into wheel...",
    "  *** Making wheel...",
    "  *** Created llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl",
    "  Building wheel for llama-cpp-python (pyproject.toml): finished with status 'done'",
    "Successfully built llama-cpp-python",
]


def filtered(tmp_path: Path, tty: bool, command: list[str] | None = None) -> tuple[int, str, Path]:
    out, log = io.StringIO(), tmp_path / "logs" / "build.log"
    code = run(
        command or [sys.executable, "-c", f"import sys; sys.stdout.write(open({str(EXCERPT)!r}).read())"], log, out, tty
    )
    return code, out.getvalue(), log


def test_a_real_build_log_shows_pips_steps_the_stages_and_each_build_step(tmp_path: Path) -> None:
    code, shown, log = filtered(tmp_path, tty=False)
    assert code == 0
    assert shown.splitlines() == SHOWN  # nothing else: no compiler warning, no CMake line, no inner pip
    assert log.read_bytes() == EXCERPT.read_bytes()  # the whole of it, as it came


def test_on_a_terminal_the_steps_are_one_line_updated_in_place(tmp_path: Path) -> None:
    code, shown, _log = filtered(tmp_path, tty=True)
    assert code == 0
    lines = shown.split("\n")
    steps = [line for line in lines if "[1/193]" in line]
    assert len(steps) == 1  # every step on the same line, each drawn over the one before
    drawn = steps[0].split("\r\x1b[K")[1:]
    assert [d.split("  (")[0] for d in drawn] == [s for s in SHOWN if "/193]" in s]
    assert all(d.endswith(")") and ":" in d.rsplit("(", 1)[1] for d in drawn)  # with the time so far
    # pip's lines before and after stay lines of their own.
    assert [line for line in lines if line and "/193]" not in line] == [s for s in SHOWN if "/193]" not in s]


def test_a_long_step_still_shows_the_time_going_on(tmp_path: Path) -> None:
    """A step that takes minutes (ggml-cpu's kernels on 2 cores): the line is redrawn with
    the time though nothing new came."""
    script = "import sys, time; print('  [1/2] a.o', flush=True); time.sleep(2.2); print('  [2/2] b.o')"
    code, shown, _log = filtered(tmp_path, tty=True, command=[sys.executable, "-c", script])
    assert code == 0
    assert shown.count("[1/2] a.o") >= 2, shown


def test_a_failed_build_shows_its_last_lines_and_its_status(tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "print('Collecting llama-cpp-python==0.3.36')\n"
        "for n in range(60): print(f'  noise {n}')\n"
        "print('  ninja: build stopped: subcommand failed.')\n"
        "sys.exit(3)\n"
    )
    code, shown, log = filtered(tmp_path, tty=False, command=[sys.executable, "-c", script])
    assert code == 3
    assert shown.startswith(
        "Collecting llama-cpp-python==0.3.36\nThe command failed (3); its last lines (all of it in "
    )
    assert str(log) in shown and "  |   noise 21\n" in shown and "noise 20\n" not in shown
    assert shown.endswith("  |   ninja: build stopped: subcommand failed.\n")
    assert "noise 0\n" in log.read_text()


def test_lines_end_at_newlines_and_carriage_returns() -> None:
    assert list(lines_of([b"a\rb\r\n", b"c", b"d\ne"])) == ["a", "b", "cd", "e"]


def test_a_step_is_named_by_what_it_makes() -> None:
    assert step_label("/usr/bin/g++ -O3 -c x.cpp -o vendor/CMakeFiles/ggml.dir/ggml.cpp.o -MD") == "ggml.cpp.o"
    assert step_label(": && /usr/bin/cmake -E rm -f lib/libx.a && /usr/bin/ar qc lib/libx.a a.o") == "libx.a"
    assert step_label("Building CXX object vendor/llama.cpp/src/llama.cpp.o") == "llama.cpp.o"
    assert step_label("Generating something") == "Generating something"


def test_a_pip_line_ends_the_step_line_first() -> None:
    out = io.StringIO()
    progress = Progress(out, tty=True)
    progress.line("  [1/1] a.o")
    progress.line("Successfully built llama-cpp-python")
    assert out.getvalue().endswith("\nSuccessfully built llama-cpp-python\n")
