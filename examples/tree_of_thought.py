"""Tree of thought: sampled descriptions of an image (thoughts), each expanded into sampled answers,
each answer judged with select; the answers the judge accepts vote. Two levels of fork: every level
commits its shared prefix (image, question, thought) once and its branches reuse it."""

from collections import Counter

import vlserve.lang as sgl


@sgl.function
def tree_of_thought(s, picture, question, num_thoughts=3, num_answers=2):
    s += sgl.user(sgl.image(picture) + "Describe the image in one sentence.")
    thoughts = s.fork(num_thoughts)
    thoughts += sgl.assistant(sgl.gen("thought", max_tokens=24, temperature=0.8))
    groups = []  # every thought's answers start before any is joined, so all leaves run side by side
    for thought in thoughts:
        answers = thought.fork(num_answers)
        answers += sgl.user(question) + sgl.assistant(sgl.gen("answer", max_tokens=8, temperature=0.8))
        answers += sgl.user("Is that right?") + sgl.assistant(sgl.select("verdict", choices=[" yes", " no"]))
        groups.append(answers)
    for answers in groups:
        answers.join()
    thoughts.join()
    # join gathers one level at a time: s["answer"][thought][answer]
    leaves = [(a.strip(), v) for answers, verdicts in zip(s["answer"], s["verdict"]) for a, v in zip(answers, verdicts)]
    accepted = [a for a, v in leaves if v == " yes"] or [a for a, _ in leaves]
    s["final"] = Counter(accepted).most_common(1)[0][0]


def main(backend, seeds=range(40, 44)) -> list[tuple[str, str, str]]:
    from common import scene

    items = [(picture, qas[0]) for picture, qas in map(scene, seeds)]
    states = tree_of_thought.run_batch([{"picture": p, "question": qa.question} for p, qa in items],
                                       backend=backend)
    return [(qa.question, s["final"], qa.answer) for (_, qa), s in zip(items, states)]


if __name__ == "__main__":
    from common import backend_from_args

    for question, answer, truth in main(backend_from_args(__doc__)):
        print(f"{question} -> {answer}   (truth: {truth})")
