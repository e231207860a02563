"""Few-shot visual QA: the same worked examples (images, questions, answers) open every prompt, so
run_batch caches them once and each question reuses their KV."""

import vlserve.lang as sgl


@sgl.function
def few_shot_qa(s, shots, picture, question):
    for shot_picture, shot_question, shot_answer in shots:
        s += sgl.user(sgl.image(shot_picture) + shot_question)
        s += sgl.assistant(" " + shot_answer)
    s += sgl.user(sgl.image(picture) + question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=16))


def main(backend, n_shots: int = 2, n_questions: int = 6) -> list[tuple[str, str, str]]:
    from common import scene

    shots = [(picture, qas[0].question, qas[0].answer) for picture, qas in map(scene, range(100, 100 + n_shots))]
    items = [(picture, qas[i % len(qas)]) for i, (picture, qas) in
             enumerate(map(scene, range(200, 200 + n_questions)))]
    states = few_shot_qa.bind(shots=shots).run_batch(
        [{"picture": picture, "question": qa.question} for picture, qa in items], temperature=0, backend=backend)
    return [(qa.question, s["answer"].strip(), qa.answer) for (_, qa), s in zip(items, states)]


if __name__ == "__main__":
    from common import backend_from_args

    for question, answer, truth in main(backend_from_args(__doc__)):
        print(f"{question} -> {answer}   (truth: {truth})")
