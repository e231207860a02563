"""The tree-of-thought and essay-judge programs of examples/ written against the plain openai client
(what a user writes without vlserve.lang): threads for the branches, messages by hand, select and
the regex by prompting and parsing. benchmarks/frontend.py times them and counts their lines."""

import base64
import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

GRADE_SCHEMA = {"type": "object", "properties": {"grade": {"type": "string", "enum": list("ABCDF")},
                                                 "related": {"type": "string", "enum": ["yes", "no"]}},
                "required": ["grade", "related"]}


def chat(client, model, messages, **kwargs) -> str:
    return client.chat.completions.create(model=model, messages=messages, **kwargs).choices[0].message.content


def image_turn(picture: bytes, text: str) -> dict:
    url = "data:image/png;base64," + base64.b64encode(picture).decode()
    return {"role": "user",
            "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]}


def yes_or_no(client, model, messages) -> str:
    answer = chat(client, model, messages, max_tokens=2, temperature=0).strip().lower()
    return "yes" if answer.startswith("yes") else "no"


def tree_of_thought(client, model, picture, question, num_thoughts=3, num_answers=2):
    first = [image_turn(picture, "Describe the image in one sentence.")]

    def leaf(history):
        messages = history + [{"role": "user", "content": question}]
        answer = chat(client, model, messages, max_tokens=8, temperature=0.8)
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "Is that right?"}]
        return answer.strip(), yes_or_no(client, model, messages)

    def thought(_):
        text = chat(client, model, first, max_tokens=24, temperature=0.8)
        history = first + [{"role": "assistant", "content": text}]
        with ThreadPoolExecutor(num_answers) as pool:
            return list(pool.map(lambda _: leaf(history), range(num_answers)))

    with ThreadPoolExecutor(num_thoughts) as pool:
        leaves = [leaf for leaves in pool.map(thought, range(num_thoughts)) for leaf in leaves]
    accepted = [a for a, v in leaves if v == "yes"] or [a for a, _ in leaves]
    return Counter(accepted).most_common(1)[0][0]


def essay_judge(client, model, picture, essay, questions):
    messages = [image_turn(picture, "Describe the image in one sentence."), {"role": "assistant", "content": essay},
                {"role": "user", "content": "Is the description right?"}]
    related = yes_or_no(client, model, messages)
    messages.append({"role": "assistant", "content": related})

    def judge(question):
        turn = messages + [{"role": "user", "content": question}]
        return chat(client, model, turn, max_tokens=24, temperature=0).strip()

    with ThreadPoolExecutor(len(questions)) as pool:
        judgments = list(pool.map(judge, questions))
    agree = sum(j.lower() in essay.lower() for j in judgments)
    messages.append({"role": "user", "content": "Judgments: " + "; ".join(judgments) + f". {agree} agree. Grade it."})
    grade = chat(client, model, messages, max_tokens=24, temperature=0,
                 response_format={"type": "json_schema", "json_schema": {"name": "grade", "schema": GRADE_SCHEMA}})
    return {"related": related, "judgments": judgments, "agree": agree, "grade": json.loads(grade)}
