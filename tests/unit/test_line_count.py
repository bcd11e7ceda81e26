"""tools/line_count.py counts as `wc -l` does, by top-level folder."""

from __future__ import annotations

from tools import line_count


def test_counts_physical_lines_by_top_level_folder(tmp_path):
    package = tmp_path / "pkg"
    (package / "tier" / "deep").mkdir(parents=True)
    # Blank lines, comments and docstrings count; a last line without a newline does not.
    (package / "__init__.py").write_text('"""Doc."""\n\n# why\nx = 1\n')
    (package / "tier" / "a.py").write_text("a = 1\nb = 2")
    (package / "tier" / "deep" / "b.py").write_text("\n\n\n")
    (package / "notes.txt").write_text("not python\n" * 10)

    total, modules, folders = line_count.count(package)

    assert (total, modules) == (8, 3)
    assert folders == {line_count.TOP: 4, "tier": 4}
    assert line_count.report(package).splitlines() == [
        "total       8  (3 modules)",
        "(top)       4",
        "tier        4",
    ]


def test_refuses_a_path_that_is_not_a_folder(tmp_path, capsys):
    assert line_count.main([str(tmp_path / "missing")]) == 2
    assert "is not a folder" in capsys.readouterr().err
