"""Script preflight (policy/script_preflight.py): a Python or Node script written as shell text is
refused with the line and the fix, before it runs; what cannot be read fails closed only where
the script reaches the interpreter unread; files outside the working directory are never read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from procpilot.errors import ScriptHasShellSyntax, ScriptNotCheckable
from procpilot.policy.script_preflight import check_scripts, might_run_scripts, shell_syntax_in


def test_a_python_script_with_a_shell_variable_is_refused_with_its_line(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("import json\n# uses $HOME in a comment: fine\npayload = $DM_JSON\n")
    with pytest.raises(ScriptHasShellSyntax) as info:
        check_scripts("python3 bad.py", tmp_path)
    assert "($DM_JSON) in python script: bad.py:3." in info.value.message
    assert 'os.environ.get("DM_JSON")' in info.value.message  # the fix, in the script's language
    assert info.value.details == {"script": str(tmp_path / "bad.py"), "line": 3}


def test_strings_and_comments_are_not_shell_text(tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text('import os\nprice = "$5"\n# $(date)\nprint(f"{price}")\n')
    # (Not on the first line of code: there a $NAME counts even in a string, as a shell line saved.)
    (tmp_path / "ok.js").write_text("const $el = 1;\n// $HOME\nconsole.log(`${$el}`, '$PATH');\n")
    check_scripts("python ok.py && node ok.js", tmp_path)  # nothing raised


def test_the_check_sees_through_wrappers_pipelines_and_sh_c(tmp_path: Path) -> None:
    (tmp_path / "bad.js").write_text("const x = 1;\nconsole.log(${TOKEN});\n")
    for command in ("env A=1 timeout 5 node bad.js", "echo hi | node bad.js", "sh -c 'node bad.js'"):
        with pytest.raises(ScriptHasShellSyntax, match=r"bad\.js:2"):
            check_scripts(command, tmp_path)


def test_a_node_preload_is_read_like_the_script(tmp_path: Path) -> None:
    (tmp_path / "pre.js").write_text("const key = $API_KEY;\n")
    with pytest.raises(ScriptHasShellSyntax, match=r"pre\.js:1"):
        check_scripts("node -r ./pre.js -e 'console.log(1)'", tmp_path)


def test_a_shell_line_saved_as_a_script_is_refused_even_inside_a_string(tmp_path: Path) -> None:
    (tmp_path / "line.py").write_text('\n# a comment first\nprint("$TMPDIR/x.json")\n')
    with pytest.raises(ScriptHasShellSyntax, match=r"\(\$TMPDIR\) in python script: line\.py:3"):
        check_scripts("python line.py", tmp_path)


def test_a_script_fed_unread_fails_closed(tmp_path: Path) -> None:
    (tmp_path / "x.py").write_text("print(1)\n")
    for command in ("cat x.py | python3", "python3 <(cat x.py)"):
        with pytest.raises(ScriptNotCheckable, match="complex interpreter invocation"):
            check_scripts(command, tmp_path)


def test_fail_closed_refuses_a_script_under_sh_c_or_control_flow_unread(tmp_path: Path) -> None:
    (tmp_path / "fine.py").write_text("print(1)\n")
    check_scripts("sh -c 'python fine.py'", tmp_path)  # read through, and clean
    for command in ("sh -c 'python fine.py'", "if true; then python fine.py; fi"):
        with pytest.raises(ScriptNotCheckable):
            check_scripts(command, tmp_path, fail_closed=True)


def test_files_outside_the_working_directory_are_never_read(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "outside.py").write_text("x = $SECRET\n")
    (work / "link.py").symlink_to(tmp_path / "outside.py")
    check_scripts("python ../outside.py", work)  # no probe of files outside
    check_scripts("python link.py", work)  # not through a symlink either
    check_scripts(f"python {tmp_path / 'outside.py'}", work)


def test_what_cannot_be_read_is_left_to_the_interpreter(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.py")  # a FIFO in a script's place must not stall the call
    check_scripts("python fifo.py", tmp_path)
    check_scripts("python missing.py", tmp_path)
    check_scripts("python --version bad.py", tmp_path)  # prints a version: runs no script
    check_scripts("python -c 'print(1)'", tmp_path)


def test_might_run_scripts_and_shell_syntax_in() -> None:
    assert might_run_scripts("cd x && python3 y.py")
    assert not might_run_scripts("ls -la | grep foo")
    assert shell_syntax_in("a = 1\nb = $(date)\n", "python") == (2, "b = $(date)")
    assert shell_syntax_in("const $ = jQuery;\n$('#x');\n", "node") is None  # $ is a JS identifier
    assert shell_syntax_in("x = '$HOME'\n", "python") is None
