"""Math (math-verify) and code (sandbox) rewards with TRL's signature."""

import threading

import pytest

from tiltlab.llm.base.rewards import (
    code_job,
    code_reward,
    extract_boxed,
    extract_code,
    make_code_reward,
    math_equal,
    math_reward,
    verifiable_reward,
)
from tiltlab.llm.base.tasks import arithmetic_tasks, function_tasks


def test_extract_boxed_last_and_nested():
    assert extract_boxed("a \\boxed{1} then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert extract_boxed("\\boxed{ {a}+{b} }") == " {a}+{b} "
    assert extract_boxed("\\fbox{7}") == "7"
    assert extract_boxed("no box") is None
    assert extract_boxed("\\boxed{unclosed") is None


@pytest.mark.parametrize(
    "pred,gold,ok",
    [
        ("42", "42", True),
        ("\\frac{1}{2}", "0.5", True),
        ("1/2", "\\frac12", True),
        ("-17", "-17", True),
        ("41", "42", False),
        ("x^2+2x+1", "(x+1)^2", True),
        ("\\sqrt{2}", "2", False),
        ("6", "-6", False),
    ],
)
def test_math_equal(pred, gold, ok):
    assert math_equal(pred, gold) is ok


def test_math_reward_signature_and_values():
    comps = ["so \\boxed{42}.", "\\boxed{41}", "the answer is 42", [{"role": "assistant", "content": "\\boxed{3}"}]]
    r = math_reward(["p"] * 4, comps, completion_ids=None, answer=["42", "42", "42", "3"], id=list("abcd"))
    assert r == [1.0, 0.0, 0.0, 1.0]
    # unboxed answers are parsed only when asked
    assert math_reward(None, ["the answer is 42"], answer=["42"], require_boxed=False) == [1.0]
    assert math_reward(None, ["x", "\\boxed{1}"], answer=[None, "1"]) == [None, 1.0]


def test_math_reward_errors():
    with pytest.raises(ValueError, match="column 'answer'"):
        math_reward(None, ["\\boxed{1}"])
    with pytest.raises(ValueError, match="2 entries for 1"):
        math_reward(None, ["\\boxed{1}"], answer=["1", "2"])
    with pytest.raises(ValueError, match="completion must be"):
        math_reward(None, [3], answer=["3"])


def test_math_reward_on_synthetic_tasks_all_levels():
    rows = arithmetic_tasks(15, seed=3)
    good = [f"Working... \\boxed{{{r['answer']}}}" for r in rows]
    bad = [f"\\boxed{{{int(r['answer']) + 1}}}" for r in rows]
    answers = [r["answer"] for r in rows]
    assert math_reward(None, good, answer=answers) == [1.0] * 15
    assert math_reward(None, bad, answer=answers) == [0.0] * 15


def test_math_reward_off_main_thread():
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", math_reward(None, ["\\boxed{2}"], answer=["2"])))
    t.start()
    t.join(30)
    assert out["r"] == [1.0]


_CODE = "def f(x):\n    return x\n"


@pytest.mark.parametrize(
    "text,want",
    [
        # CRLF line endings (a completion decoded from a Windows-trained tokenizer): the block is recognised
        ("Here:\r\n```python\r\ndef f(x):\r\n    return x\r\n```\r\n", _CODE),
        # several python blocks: the last one
        ("```python\nx = 1\n```\nbetter:\n```python\n" + _CODE + "```\n", _CODE),
        # a python block, then an unlabeled block of its output: the python block is the code
        ("```python\n" + _CODE + "```\nOutput:\n```\n5\n```\n", _CODE),
        ("```python\n" + _CODE + "```\nRun it:\n```bash\npython f.py\n```\n", _CODE),
        # the labels the rule reads as python, in any case
        ("```py\n" + _CODE + "```", _CODE),
        ("```python3\n" + _CODE + "```", _CODE),
        ("```Python\n" + _CODE + "```", _CODE),
        # unlabeled blocks only: the last one
        ("```\nx = 1\n```\n```\n" + _CODE + "```\n", _CODE),
        # a closing fence at the end of the last code line
        ("```python\ndef f(x):\n    return x```\n", _CODE),
        # a block cut off by the token limit runs to the end of the text
        ("```python\n" + _CODE, _CODE),
        # no fence at all: the whole text
        (_CODE, _CODE),
        ("def f(x): return 1", "def f(x): return 1"),
    ],
)
def test_extract_code_follows_the_documented_rule(text, want):
    assert extract_code(text) == want


def test_extract_code_and_program():
    text = "first\n```python\nx = 1\n```\nthen\n```py\ndef f(x):\n    return x\n```\n"
    assert extract_code(text) == "def f(x):\n    return x\n"
    assert extract_code("def f(x): return 1") == "def f(x): return 1"
    job = code_job("def g(x): return x", "def check(candidate):\n    assert candidate(1) == 1\n", "g")
    assert job.tests.rstrip().endswith("check(g)") and job.code == "def g(x): return x" and not job.stdio
    assert job.entry_point == "g"  # the judge binds the name to the candidate's g even if a builtin has it
    assert "check(" not in code_job("def g(x): return x", "assert g(1) == 1\n", "g").tests
    # the tests never reach the candidate's code
    assert "assert" not in code_job("def g(x): return x", "assert g(1) == 1\n", "g").code
    with pytest.raises(ValueError, match="unknown test_type"):
        code_job("x", "y", test_type="pytest")


def test_code_reward_on_synthetic_tasks():
    rows = function_tasks(5, seed=1)
    tests = [r["tests"] for r in rows]
    good = [f"Here:\n```python\n{r['solution']}```" for r in rows]
    assert code_reward(None, good, tests=tests) == [1.0] * 5
    assert code_reward(None, ["```python\ndef f(x):\n    return None\n```"] * 5, tests=tests) == [0.0] * 5
    assert code_reward(None, ["no code at all"], tests=[tests[0]]) == [0.0]


def test_code_reward_humaneval_style_check():
    fn = make_code_reward(name="he")
    tests = "def check(candidate):\n    assert candidate(2) == 3\n"
    assert fn.__name__ == "he"
    r = fn(
        None,
        ["def inc(x):\n    return x + 1\n", "def inc(x):\n    return x\n"],
        tests=[tests] * 2,
        entry_point=["inc", "inc"],
    )
    assert r == [1.0, 0.0]


def test_verifiable_reward_dispatch():
    row = function_tasks(1)[0]
    comps = ["\\boxed{5}", f"```python\n{row['solution']}```", "\\boxed{5}", "nothing"]
    r = verifiable_reward(None, comps, answer=["5", None, "6", None], tests=[None, row["tests"], None, None])
    assert r == [1.0, 1.0, 0.0, 0.0]


def test_join_code_puts_future_imports_first():
    from tiltlab.llm.base.rewards import join_code

    out = join_code(
        "import os\n", '"""doc"""\nfrom __future__ import annotations\nx = 1', "from __future__ import annotations\n"
    )
    assert out == 'from __future__ import annotations\nimport os\n"""doc"""\nx = 1\n'
    compile(out, "<t>", "exec")
    assert join_code("a = 1", "", "b = 2\n") == "a = 1\nb = 2\n"


def test_prompt_parts_and_the_judge_gets_the_helpers():
    from tiltlab.llm.base.rewards import prompt_parts

    prefix = (
        "import math\nfrom typing import List\n\n\n@staticmethod\ndef helper(x):\n    return math.sqrt(x)\n\n\n"
        'K = 3\n\n\ndef entry(xs: List[int]) -> int:\n    """doc"""\n'
    )
    imports, support = prompt_parts(prefix, "entry")
    assert imports == "import math\nfrom typing import List\n"
    assert "@staticmethod\ndef helper(x)" in support and "K = 3" in support and "def entry" not in support
    assert prompt_parts("import os\ndef broken(:\n", "broken") == ("import os\n", "import os\n")
    tests = "def check(candidate):\n    assert candidate([1]) == 1\n"
    body = code_job("    return len(xs)\n", tests, "entry", code_prefix=prefix)  # a continuation
    assert body.code.startswith(prefix) and body.code.endswith("    return len(xs)\n")
    full = code_job(
        "from __future__ import annotations\ndef entry(xs):\n    return helper(1)\n", tests, "entry", code_prefix=prefix
    )
    assert full.code.startswith("from __future__ import annotations\nimport math\nfrom typing import List\n")
    assert "def helper" in full.code and full.code.count("def entry") == 1
    for job in (body, full):  # the judge defines the helpers before the tests, then calls check
        assert job.tests.index("def helper") < job.tests.index("def check") < job.tests.index("check(entry)")
        assert "def entry" not in job.tests
    # without a prefix nothing is added
    assert code_job("def entry(xs):\n    return 1\n", tests, "entry").code == "def entry(xs):\n    return 1\n"


def test_functional_prelude_after_future_import():
    from tiltlab.llm.base.rewards import _FUNCTIONAL_PRELUDE

    job = code_job("from __future__ import annotations\nclass Solution:\n    pass\n", "{}", test_type="functional")
    assert job.code.startswith("from __future__ import annotations\n" + _FUNCTIONAL_PRELUDE) and not job.stdio
    assert code_job("print(1)", '{"cases": []}', test_type="stdio").stdio
    compile(job.code, "<t>", "exec")


# LeetCodeDataset rows: the prompt defines TreeNode / ListNode and the helpers the tests build inputs
# and compare outputs with; entry_point is an expression (``Solution().maxDepth``)
_LC_PROMPT = """from typing import *
from collections import deque


class ListNode:
    def __init__(self, val=0, next=None):
        self.val = val
        self.next = next


def list_node(values: list):
    if not values:
        return None
    head = ListNode(values[0])
    p = head
    for val in values[1:]:
        node = ListNode(val)
        p.next = node
        p = node
    return head


def is_same_list(p1, p2):
    if p1 is None and p2 is None:
        return True
    if not p1 or not p2:
        return False
    return p1.val == p2.val and is_same_list(p1.next, p2.next)


class TreeNode:
    def __init__(self, val=0, left=None, right=None):
        self.val = val
        self.left = left
        self.right = right


def tree_node(values: list):
    if not values:
        return None
    root = TreeNode(values[0])
    i = 1
    queue = deque()
    queue.append(root)
    while queue:
        node = queue.popleft()
        if i < len(values) and values[i] is not None:
            node.left = TreeNode(values[i])
            queue.append(node.left)
        i += 1
        if i < len(values) and values[i] is not None:
            node.right = TreeNode(values[i])
            queue.append(node.right)
        i += 1
    return root


def is_same_tree(p, q):
    if not p and not q:
        return True
    elif not p or not q:
        return False
    elif p.val != q.val:
        return False
    else:
        return is_same_tree(p.left, q.left) and is_same_tree(p.right, q.right)
"""
_LC_ROWS = {
    "max_depth": (
        "Solution().maxDepth",
        "def check(candidate):\n    assert candidate(root = tree_node([3,9,20,None,None,15,7])) == 3\n"
        "    assert candidate(root = tree_node([1,None,2])) == 2\n    assert candidate(root = tree_node([])) == 0\n",
        "class Solution:\n    def maxDepth(self, root: Optional[TreeNode]) -> int:\n        if root is None:\n"
        "            return 0\n        return 1 + max(self.maxDepth(root.left), self.maxDepth(root.right))\n",
        "class Solution:\n    def maxDepth(self, root: Optional[TreeNode]) -> int:\n        if root is None:\n"
        "            return 0\n        return 1 + self.maxDepth(root.left)\n",
    ),
    "invert_tree": (
        "Solution().invertTree",
        "def check(candidate):\n"
        "    assert is_same_tree(candidate(root = tree_node([4,2,7,1,3,6,9])), tree_node([4,7,2,9,6,3,1]))\n"
        "    assert is_same_tree(candidate(root = tree_node([2,1,3])), tree_node([2,3,1]))\n"
        "    assert is_same_tree(candidate(root = tree_node([])), tree_node([]))\n",
        "class Solution:\n    def invertTree(self, root: Optional[TreeNode]) -> Optional[TreeNode]:\n"
        "        if root:\n            root.left, root.right = self.invertTree(root.right), self.invertTree(root.left)\n"
        "        return root\n",
        "class Solution:\n    def invertTree(self, root: Optional[TreeNode]) -> Optional[TreeNode]:\n"
        "        return root\n",
    ),
    "reverse_list": (
        "Solution().reverseList",
        "def check(candidate):\n"
        "    assert is_same_list(candidate(head = list_node([1, 2, 3, 4, 5])), list_node([5, 4, 3, 2, 1]))\n"
        "    assert is_same_list(candidate(head = list_node([1, 2])), list_node([2, 1]))\n"
        "    assert is_same_list(candidate(head = list_node([])), list_node([]))\n",
        "class Solution:\n    def reverseList(self, head: Optional[ListNode]) -> Optional[ListNode]:\n"
        "        prev = None\n        while head:\n            head.next, prev, head = prev, head, head.next\n"
        "        return prev\n",
        "class Solution:\n    def reverseList(self, head: Optional[ListNode]) -> Optional[ListNode]:\n"
        "        return head\n",
    ),
    # two arguments that share nodes (LeetCode 160): the shared tail stays shared in the sandbox
    "intersection": (
        "Solution().getIntersectionNode",
        "def check(candidate):\n    tail = list_node([8, 4, 5])\n    a = ListNode(4, ListNode(1, tail))\n"
        "    b = ListNode(5, ListNode(6, ListNode(1, tail)))\n    assert is_same_list(candidate(headA = a, headB = b), tail)\n"
        "    assert candidate(headA = list_node([2, 6, 4]), headB = list_node([1, 5])) is None\n",
        "class Solution:\n    def getIntersectionNode(self, headA: ListNode, headB: ListNode) -> Optional[ListNode]:\n"
        "        seen = set()\n        while headA:\n            seen.add(id(headA))\n            headA = headA.next\n"
        "        while headB:\n            if id(headB) in seen:\n                return headB\n            headB = headB.next\n"
        "        return None\n",
        "class Solution:\n    def getIntersectionNode(self, headA: ListNode, headB: ListNode) -> Optional[ListNode]:\n"
        "        while headA and headB:\n            if headA.val == headB.val:\n                return headA\n"
        "            headA, headB = headA.next, headB.next\n        return None\n",
    ),
}


@pytest.mark.parametrize("task", sorted(_LC_ROWS))
def test_code_reward_leetcode_rows_with_prompt_defined_classes(task):
    _right_paid_wrong_not(_LC_ROWS[task], _LC_PROMPT)


def _right_paid_wrong_not(row, prompt):
    entry, tests, right, wrong = row
    fn = make_code_reward()
    r = fn(None, [right, wrong], tests=[tests] * 2, entry_point=[entry] * 2, code_prefix=[prompt] * 2)
    assert r == [1.0, 0.0], [res.judge_stderr[-400:] for res in fn.last_results]


# tasks that change their arguments in place and return nothing or one of the nodes they were given: judged on
# the judge's own objects, as one process would judge them (LeetCode 143, 114, 237, 876; a list attribute; a
# new node both linked in place and returned; a call that changes a node, then raises)
_LC_PROMPT_BAG = _LC_PROMPT + "\n\nclass Bag:\n    def __init__(self):\n        self.items = []\n"
_LC_IN_PLACE = {
    "reorder_list": (
        "Solution().reorderList",
        "def check(candidate):\n    head = list_node([1, 2, 3, 4])\n    assert candidate(head = head) is None\n"
        "    assert is_same_list(head, list_node([1, 4, 2, 3]))\n    head = list_node([1, 2, 3, 4, 5])\n"
        "    candidate(head = head)\n    assert is_same_list(head, list_node([1, 5, 2, 4, 3]))\n",
        "class Solution:\n    def reorderList(self, head: Optional[ListNode]) -> None:\n        nodes = []\n"
        "        while head:\n            nodes.append(head)\n            head = head.next\n        i, j = 0, len(nodes) - 1\n"
        "        while i < j:\n            nodes[i].next = nodes[j]\n            i += 1\n            if i == j:\n"
        "                break\n            nodes[j].next = nodes[i]\n            j -= 1\n        nodes[i].next = None\n",
        "class Solution:\n    def reorderList(self, head: Optional[ListNode]) -> None:\n        head = list_node([1, 4, 2, 3])\n",
    ),
    "flatten_tree": (
        "Solution().flatten",
        "def check(candidate):\n    root = tree_node([1, 2, 5, 3, 4, None, 6])\n    candidate(root = root)\n"
        "    assert is_same_tree(root, tree_node([1, None, 2, None, 3, None, 4, None, 5, None, 6]))\n",
        "class Solution:\n    def flatten(self, root: Optional[TreeNode]) -> None:\n        order = []\n"
        "        def walk(n):\n            if n:\n                order.append(n)\n                walk(n.left)\n"
        "                walk(n.right)\n        walk(root)\n        for a, b in zip(order, order[1:] + [None]):\n"
        "            a.left, a.right = None, b\n",
        "class Solution:\n    def flatten(self, root: Optional[TreeNode]) -> None:\n        root.left = None\n",
    ),
    # the argument is a node in the middle of the judge's list: the change shows through the head
    "delete_node": (
        "Solution().deleteNode",
        "def check(candidate):\n    head = list_node([4, 5, 1, 9])\n    candidate(node = head.next)\n"
        "    assert is_same_list(head, list_node([4, 1, 9]))\n",
        "class Solution:\n    def deleteNode(self, node):\n        node.val = node.next.val\n"
        "        node.next = node.next.next\n",
        "class Solution:\n    def deleteNode(self, node):\n        node = node.next\n",
    ),
    # the result is one of the nodes that crossed: the judge gets its own node back, so `is` holds
    "middle_node": (
        "Solution().middleNode",
        "def check(candidate):\n    head = list_node([1, 2, 3, 4, 5])\n    assert candidate(head = head) is head.next.next\n",
        "class Solution:\n    def middleNode(self, head):\n        slow = fast = head\n        while fast and fast.next:\n"
        "            slow, fast = slow.next, fast.next.next\n        return slow\n",
        "class Solution:\n    def middleNode(self, head):\n        slow = fast = head\n        while fast and fast.next:\n"
        "            slow, fast = slow.next, fast.next.next\n        return ListNode(slow.val, slow.next)\n",
    ),
    "list_attribute": (
        "add",
        "def check(candidate):\n    bag = Bag()\n    items = bag.items\n    candidate(bag, 3)\n"
        "    assert bag.items is items and items == [3]\n",
        "def add(bag, x):\n    bag.items.append(x)\n",
        "def add(bag, x):\n    bag.items = bag.items + [x]\n",
    ),
    "linked_and_returned": (
        "insert_after",
        "def check(candidate):\n    head = list_node([1, 3])\n    new = candidate(head, 2)\n"
        "    assert new is head.next and is_same_list(head, list_node([1, 2, 3]))\n",
        "def insert_after(head, v):\n    head.next = ListNode(v, head.next)\n    return head.next\n",
        "def insert_after(head, v):\n    node = ListNode(v, head.next)\n    head.next = ListNode(v, node.next)\n"
        "    return node\n",
    ),
    "changed_then_raised": (
        "touch",
        "def check(candidate):\n    node = ListNode(1)\n    try:\n        candidate(node)\n    except ValueError:\n"
        "        pass\n    assert node.val == 9\n",
        "def touch(node):\n    node.val = 9\n    raise ValueError('done')\n",
        "def touch(node):\n    raise ValueError('done')\n",
    ),
}


@pytest.mark.parametrize("task", sorted(_LC_IN_PLACE))
def test_code_reward_in_place_changes_to_prompt_defined_objects(task):
    _right_paid_wrong_not(_LC_IN_PLACE[task], _LC_PROMPT_BAG)


# --------------------------------------------------------------------------- benchmarks/bench_sandbox.py --mixed
def _bench_sandbox():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_sandbox.py"
    spec = importlib.util.spec_from_file_location("bench_sandbox", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_bench_sandbox_mixed_rows_are_judged_as_their_kind_says():
    # the benchmark's own guard: every kind's known reward, checked against a real judging of one cycle
    from tiltlab.llm.base.rewards import make_code_reward
    from tiltlab.llm.base.tasks import function_tasks

    bench = _bench_sandbox()
    kinds = list(bench.MIXED_KINDS)
    rows = function_tasks(len(kinds) + 3, seed=0)
    comps, cols, want = bench.mixed_rows(rows)
    assert want == [bench.MIXED_KINDS[kinds[i % len(kinds)]] for i in range(len(rows))]
    assert cols["test_type"][: len(kinds)] == [
        "stdio" if k.startswith("stdio") else "functional" if k.startswith("functional") else "assert" for k in kinds
    ]
    assert all(len(v) == len(rows) for v in cols.values()) and len(comps) == len(rows)
    n = len(kinds)
    got = make_code_reward(max_workers=2)(None, comps[:n], **{k: v[:n] for k, v in cols.items()})
    assert got == want[:n]


def test_bench_sandbox_times_both_judge_paths_interleaved(capsys):
    import json

    bench = _bench_sandbox()
    assert bench.main(["--mixed", "--n", "8", "--repeats", "1", "--judge-server", "both", "--workers", "2"]) == 0
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rep["judge_server"] == "both" and rep["n"] == 8 and rep["paid"] == 4
    on, off = rep["rewards_per_s_median"], rep["rewards_per_s_median_off"]
    assert on > 0 and off > 0
    # the ratio of the unrounded medians, rounded: within rounding of the ratio of the rounded ones
    assert abs(rep["ratio_on_off_median"] - on / off) <= 0.005 + 0.05 * (on + off) / off**2
