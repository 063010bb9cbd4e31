"""bench agree's arbiter: where mimo and llama-server part, the verdict names the side that
left float32 math's pick, unless that math itself calls the step a near-tie."""
import pytest

from mimo.bench.agree_exact import NEAR_TIE, Parting, first_parting


def _parting(mimo, llama, exact, exact_margin):
    return Parting(step=3, mimo=mimo, llama=llama, llama_margin=0.2, exact=exact,
                   exact_margin=exact_margin, llama_as_prompt=llama)


@pytest.mark.parametrize("mimo,llama,exact,margin,verdict", [
    (5, 7, 5, 0.26, "llama"),       # mimo kept the math's pick
    (5, 7, 7, 0.26, "mimo"),        # llama-server did
    (5, 7, 9, 0.26, "both"),        # neither
    (5, 7, 7, NEAR_TIE / 2, "near-tie"),
    (5, 7, 5, NEAR_TIE, "llama"),   # the rule's bound itself is decisive
])
def test_verdict_names_the_side_that_left_the_math(mimo, llama, exact, margin, verdict):
    p = _parting(mimo, llama, exact, margin)
    assert p.verdict == verdict
    assert p.as_json()["verdict"] == verdict


def test_first_parting_looks_only_inside_the_compared_steps():
    assert first_parting([1, 2, 3, 4], [1, 2, 9, 4], upto=4) == 2
    assert first_parting([1, 2, 3, 4], [1, 2, 9, 4], upto=2) is None
    assert first_parting([1, 2, 3], [1, 2, 3, 4], upto=4) is None     # one side ended
    assert first_parting([1, 2, 1], [1, 2, 255999], upto=3) == 2


def test_the_near_tie_rule_is_the_one_asked():
    """bench agree passes its --margin: a wider rule turns a decisive step into a near-tie."""
    p = Parting(step=3, mimo=5, llama=7, llama_margin=0.2, exact=5, exact_margin=0.26,
                llama_as_prompt=7, near_tie=0.3)
    assert p.verdict == "near-tie" and p.as_json()["near_tie"] == 0.3
