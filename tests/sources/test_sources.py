import json
from pathlib import Path

import pytest

from mmbatch.errors import SourceError
from mmbatch.sources.files import image_requests


def touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    return path


def test_directory_is_walked_recursively_in_sorted_order(tmp_path: Path) -> None:
    for name in ["b.jpg", "a.png", "sub/c.webp", ".hidden.jpg", "notes.txt"]:
        touch(tmp_path / name)
    requests = image_requests([str(tmp_path)], "describe")
    assert [Path(r.id).relative_to(tmp_path).as_posix() for r in requests] == [
        "a.png",
        "b.jpg",
        "sub/c.webp",
    ]
    assert all(r.prompt == "describe" and r.media[0].source == r.id for r in requests)


def test_a_file_named_twice_is_one_item(tmp_path: Path) -> None:
    image = touch(tmp_path / "a.jpg")
    requests = image_requests([str(image), str(tmp_path)], "p")
    assert [r.id for r in requests] == [str(image)]


def test_a_named_file_is_taken_whatever_its_suffix(tmp_path: Path) -> None:
    odd = touch(tmp_path / "photo.unknown")
    assert [r.id for r in image_requests([str(odd)], "p")] == [str(odd)]


def test_glob(tmp_path: Path) -> None:
    touch(tmp_path / "x" / "1.jpg")
    touch(tmp_path / "y" / "2.jpg")
    touch(tmp_path / "y" / "2.txt")
    requests = image_requests([str(tmp_path / "**" / "*.*")], "p")
    assert [Path(r.id).name for r in requests] == ["1.jpg", "2.jpg"]


def test_jsonl_manifest_with_ids_and_prompts(tmp_path: Path) -> None:
    touch(tmp_path / "img" / "a.jpg")
    manifest = tmp_path / "m.jsonl"
    rows = [
        {"path": "img/a.jpg", "id": "first"},
        {"path": "img/a.jpg", "id": "second", "prompt": "OCR"},
    ]
    manifest.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    requests = image_requests([str(manifest)], "default")
    assert [(r.id, r.prompt) for r in requests] == [("first", "default"), ("second", "OCR")]
    assert requests[0].media[0].source == str(tmp_path / "img" / "a.jpg")


def test_csv_manifest(tmp_path: Path) -> None:
    (tmp_path / "m.csv").write_text("path,id,prompt\na.jpg,1,\nb.jpg,2,Tags?\n")
    requests = image_requests([str(tmp_path / "m.csv")], "default")
    assert [(r.id, r.prompt) for r in requests] == [("1", "default"), ("2", "Tags?")]


def test_duplicate_manifest_ids_are_refused(tmp_path: Path) -> None:
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"path": "a.jpg", "id": "x"}\n{"path": "b.jpg", "id": "x"}\n')
    with pytest.raises(SourceError, match="duplicate id 'x'"):
        image_requests([str(manifest)], "p")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"id": "1"}\n', "has no 'path'"),
        ("not json\n", "not valid JSON"),
        ("[1]\n", "JSON object"),
        ('{"path": "a.jpg", "id": null}\n', "'id' must be a non-empty string or an integer"),
        ('{"path": "a.jpg", "id": {"k": 1}}\n', 'got {"k": 1}'),
        ('{"path": "a.jpg", "id": [1]}\n', r"got \[1\]"),
        ('{"path": "a.jpg", "id": true}\n', "got true"),
        ('{"path": "a.jpg", "id": 1.5}\n', "got 1.5"),
        ('{"path": "a.jpg", "id": ""}\n', 'got ""'),
    ],
)
def test_malformed_manifest_rows_name_the_line(tmp_path: Path, content: str, message: str) -> None:
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(content)
    with pytest.raises(SourceError, match=f"m.jsonl:1: .*{message}"):
        image_requests([str(manifest)], "p")


def test_missing_input_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="does not exist"):
        image_requests([str(tmp_path / "nope.jpg")], "p")


def test_nothing_found_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no images found"):
        image_requests([str(tmp_path)], "p")


def test_manifest_ids_may_be_strings_or_integers(tmp_path: Path) -> None:
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"path": "a.jpg", "id": 7}\n{"path": "b.jpg", "id": "seven"}\n')
    assert [r.id for r in image_requests([str(manifest)], "p")] == ["7", "seven"]
