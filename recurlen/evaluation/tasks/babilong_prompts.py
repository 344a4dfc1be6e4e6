"""BABILong prompt styles: recurlen's plain prompt, and the benchmark's few-shot prompt.

    plain      <context>\\n{input}\\n</context>\\n\\nQuestion: {question}\\nAnswer:
    few_shot   the BABILong release's prompt (babilong/prompts.py, Kuratov et al., 2024): the task's
               instruction, its in-context <example>s and the answer-format post-prompt, then the context
               and the question, joined as its default template does; then "\\nAnswer:" so that a base LM
               answers as the examples do ("Answer: The most recent location of Charlie is balcony.")

The instruction / example / post-prompt texts below are the benchmark's public prompt data for qa1-qa5 (the
tasks of its leaderboard), kept verbatim so that results compare with published few-shot numbers. The metric
reads the first sentence of the answer and finds the task's labels in it, so both answer formats score.
"""

from __future__ import annotations

PROMPT_STYLES = ("plain", "few_shot")
PLAIN = "<context>\n{input}\n</context>\n\nQuestion: {question}\nAnswer:"

_LOCATIONS_QA23 = (
    "I give you context with the facts about locations and actions of different persons hidden in some random "
    "text and a question.{sep}You need to answer the question based only on the information from the facts.\n"
    "If a person got an item in the first location and travelled to the second location the item is also in the "
    "second location. If a person dropped an item in the first location and moved to the second location the item "
    "remains in the first location{end}")

FEW_SHOT: dict[str, dict[str, str]] = {
    "qa1": {
        "instruction": (
            "I will give you context with the facts about positions of different persons hidden in some random "
            "text and a question. You need to answer the question based only on the information from the facts. "
            "If a person was in different locations, use the latest location to answer the question."),
        "examples": (
            "<example>\nCharlie went to the hallway. Judith come back to the kitchen. Charlie travelled to balcony. "
            "Where is Charlie?\nAnswer: The most recent location of Charlie is balcony.\n</example>\n\n"
            "<example>\nAlan moved to the garage. Charlie went to the beach. Alan went to the shop. Rouse travelled "
            "to balcony. Where is Alan?\nAnswer: The most recent location of Alan is shop.\n</example>"),
        "post_prompt": (
            "Always return your answer in the following format: The most recent location of \u2019person\u2019 is "
            "\u2019location\u2019. Do not write anything else after that. "),
    },
    "qa2": {
        "instruction": _LOCATIONS_QA23.format(sep="", end="."),
        "examples": (
            "<example>\nCharlie went to the kitchen. Charlie got a bottle. Charlie moved to the balcony. Where is the "
            "bottle?\nAnswer: The bottle is in the balcony.\n</example>\n"
            "<example>\nAlan moved to the garage. Alan got a screw driver. Alan moved to the kitchen. Where is the "
            "screw driver?\nAnswer: The screw driver is in the kitchen.\n</example>"),
        "post_prompt": ("Always return your answer in the following format: The \u2019item\u2019 is in "
                        "\u2019location\u2019. Do not write anything else after that."),
    },
    "qa3": {
        "instruction": _LOCATIONS_QA23.format(sep=" ", end=""),
        "examples": (
            "<example>\nJohn journeyed to the bedroom.Mary grabbed the apple. Mary went back to the bathroom. Daniel "
            "journeyed to the bedroom. Daniel moved to the garden. Mary travelled to the kitchen. Where was the apple "
            "before the kitchen?\nAnswer: Before the kitchen the apple was in the bathroom.\n</example>\n"
            "<example>\nJohn went back to the bedroom. John went back to the garden. John went back to the kitchen. "
            "Sandra took the football. Sandra travelled to the garden. Sandra journeyed to the bedroom. Where was the "
            "football before the bedroom?\nAnswer: Before the kitchen the football was in the garden.\n</example>"),
        "post_prompt": ("Always return your answer in the following format: Before the $location_1& the $item$ was "
                        "in the $location_2$. Do not write anything else after that."),
    },
    "qa4": {
        "instruction": (
            "I will give you context with the facts about different people, their location and actions, hidden in "
            "some random text and a question. You need to answer the question based only on the information from "
            "the facts."),
        "examples": (
            "<example>\nThe hallway is south of the kitchen. The bedroom is north of the kitchen. What is the kitchen "
            "south of?\nAnswer: bedroom\n</example>\n"
            "<example>\nThe garden is west of the bedroom. The bedroom is west of the kitchen. What is west of the "
            "bedroom?\nAnswer: garden\n</example>"),
        "post_prompt": "Your answer should contain only one word - location. Do not write anything else after that.",
    },
    "qa5": {
        "instruction": (
            "I will give you context with the facts about locations and their relations hidden in some random text "
            "and a question. You need to answer the question based only on the information from the facts."),
        "examples": (
            "<example>\nMary picked up the apple there. Mary gave the apple to Fred. Mary moved to the bedroom. Bill "
            "took the milk there. Who did Mary give the apple to?\nAnswer: Fred\n</example>\n"
            "<example>\nJeff took the football there. Jeff passed the football to Fred. Jeff got the milk there. Bill "
            "travelled to the bedroom. Who gave the football?\nAnswer: Jeff\n</example>\n"
            "<example>\nFred picked up the apple there. Fred handed the apple to Bill. Bill journeyed to the bedroom. "
            "Jeff went back to the garden. What did Fred give to Bill?\nAnswer: apple\n</example>"),
        "post_prompt": ("Your answer should contain only one word. Do not write anything else after that. Do not "
                        "explain your answer."),
    },
}


def _escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def prompt_template(task: str, style: str) -> str:
    """The prompt of `task` in `style` as a format string with {input} and {question}."""
    if style == "plain":
        return PLAIN
    if style != "few_shot":
        raise ValueError(f"task.babilong.prompt={style!r} is unknown; allowed: {list(PROMPT_STYLES)}")
    if task not in FEW_SHOT:
        raise ValueError(f"the BABILong few-shot prompt is defined for {sorted(FEW_SHOT)}, not {task!r}; use "
                         "task.babilong.prompt=plain for it")
    p = FEW_SHOT[task]
    # The release's template joins the parts with single newlines (and strips only the prompt's ends).
    head = "\n".join(_escape(p[k]) for k in ("instruction", "examples", "post_prompt")).lstrip()
    return head + "\n<context>\n{input}\n</context>\nQuestion: {question}\nAnswer:"


__all__ = ["FEW_SHOT", "PLAIN", "PROMPT_STYLES", "prompt_template"]
