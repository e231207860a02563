"""Many questions about one image: the image is encoded once, every question forks from it."""

import vlserve.lang as sgl


@sgl.function
def image_qa(s, picture, questions):
    s += sgl.user_begin() + sgl.image(picture)
    forks = s.fork(len(questions))
    forks += lambda i: questions[i] + sgl.user_end() + sgl.assistant(sgl.gen("answer", max_tokens=16))
    forks.join()


def main(backend, seed: int = 1) -> list[tuple[str, str, str]]:
    from common import scene

    picture, qas = scene(seed)
    state = image_qa.run(picture=picture, questions=[qa.question for qa in qas], temperature=0, backend=backend)
    return [(qa.question, answer.strip(), qa.answer) for qa, answer in zip(qas, state["answer"])]


if __name__ == "__main__":
    from common import backend_from_args

    for question, answer, truth in main(backend_from_args(__doc__)):
        print(f"{question} -> {answer}   (truth: {truth})")
