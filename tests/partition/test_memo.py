from autopipe.partition.memo import Recent


def test_a_kept_answer_is_found_by_the_same_objects_and_an_equal_value() -> None:
    recent: Recent[str] = Recent(2)
    a = (1.0, 2.0)
    b = tuple(list(a))
    assert recent.put((a,), (3,), "hit") == "hit"
    assert recent.get((a,), (3,)) == "hit"
    assert recent.get((b,), (3,)) is None  # equal but another object
    assert recent.get((a,), (4,)) is None
    assert recent.get((a, a), (3,)) is None


def test_only_the_newest_answers_are_kept() -> None:
    recent: Recent[int] = Recent(2)
    keys = [(object(),) for _ in range(3)]
    for k, key in enumerate(keys):
        recent.put(key, (), k)
    assert [recent.get(key) for key in keys] == [None, 1, 2]
