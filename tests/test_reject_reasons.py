"""The printed reason of rejected requests (``sim.results.records.REJECT_REASONS`` after "N need")."""
from analysis.summary import attention_lines
from sim.results.records import REJECT_REASONS


def test_each_reason_reads_as_what_the_request_needs():
    """A gpt-oss-20b run with the vllm scheduler (whole 120k-token prompts in one step, sliding-window blocks
    of the whole prompt live) printed "2 need no pages for its next step ...", the opposite of the fact."""
    line = attention_lines({"rejected": 2, "requests": 200, "rejected_by_reason": {"pages": 2}})[0]
    assert "2 need more pages for one step than the pool has, even when running alone" in line
    assert all(text.startswith("more ") for text in REJECT_REASONS.values())
