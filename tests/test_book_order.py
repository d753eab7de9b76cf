"""tools/book_order.py: a notebook that ran before a notebook it quotes is planned again, and so is every notebook
downstream of one planned."""
import datetime
import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("book_order", Path(__file__).parent.parent / "tools" / "book_order.py")
book_order = importlib.util.module_from_spec(spec)
spec.loader.exec_module(book_order)


def _at(hour):
    return datetime.datetime(2026, 11, 29, hour)


def test_a_notebook_older_than_a_record_it_quotes_is_planned_with_everything_after_it():
    dates = {nn: _at(1 + i) for i, nn in enumerate(book_order.ORDER)}   # every notebook after the ones it quotes
    assert book_order.plan(dates) == []
    dates["00"] = _at(23)                                               # 00 ran again last: everything quotes 00
    planned = [nn for nn, _ in book_order.plan(dates)]
    assert planned == ["01", "02", "03", "04", "05", "06", "09"]   # 07 quotes no other notebook (it times its own)
    dates["00"], dates["05"] = _at(1), _at(23)                          # 05 ran again: 06
    assert book_order.plan(dates) == [("06", ["05"])]
    dates["05"], dates["07"] = _at(6), _at(23)                          # 07 ran again: 08
    assert book_order.plan(dates) == [("08", ["07"])]


def test_every_quoted_notebook_comes_earlier_in_the_order():
    pos = {nn: i for i, nn in enumerate(book_order.ORDER)}
    assert sorted(pos) == sorted(book_order.QUOTES)
    assert all(pos[q] < pos[nn] for nn, qs in book_order.QUOTES.items() for q in qs)


def test_a_stale_notebook_is_planned_with_what_quotes_it_and_packed_into_calls():
    dates = {nn: _at(1 + i) for i, nn in enumerate(book_order.ORDER)}
    assert book_order.plan(dates, stale={"09"}) == [("09", ["stale"])]          # nothing quotes 09
    assert book_order.plan(dates, stale={"07"}) == [("07", ["stale"]), ("08", ["07"])]
    assert [nn for nn, _ in book_order.plan(dates, stale={"04"})] == ["04", "05", "06"]
    secs = {"02": 300, "03": 200, "04": 100, "06": 700, "07": 50}
    assert book_order.calls(["02", "03", "04", "06", "07"], secs) == [["02", "03"], ["04"], ["06"], ["07"]]


def test_the_committed_book_shows_no_stale_outputs():
    assert book_order.stale_notebooks() == set()


def test_quotes_names_every_record_a_notebook_loads_from_another():
    """A notebook that prints another notebook's record (``Run.load("NN_...")`` in its source) must list it in QUOTES,
    or a run of the quoted notebook leaves it printing a replaced record unplanned (09 prints 00's copy speed)."""
    import re

    src = Path(__file__).parent.parent / "notebooks" / "src"
    for nn in book_order.QUOTES:
        text = next(src.glob(f"{nn}_*.py")).read_text()
        loaded = set(re.findall(r'Run\.load\(\s*"(\d\d)_', text)) - {nn}
        assert loaded <= set(book_order.QUOTES[nn]), f"{nn} loads the records of {sorted(loaded)}, QUOTES says {book_order.QUOTES[nn]}"
