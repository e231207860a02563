"""Questions about a video: its frames are prefilled once, each question forks from them."""

import vlserve.lang as sgl


@sgl.function
def video_qa(s, clip, questions, num_frames=6):
    s += sgl.user_begin() + sgl.video(clip, num_frames=num_frames)
    forks = s.fork(len(questions))
    forks += lambda i: questions[i] + sgl.user_end() + sgl.assistant(sgl.gen("answer", max_tokens=8))
    forks.join()


def main(backend, seed: int = 2) -> list[tuple[str, str, str]]:
    from common import video_scene

    clip, qas = video_scene(seed)
    state = video_qa.run(clip=clip, questions=[qa.question for qa in qas], temperature=0, backend=backend)
    return [(qa.question, answer.strip(), qa.answer) for qa, answer in zip(qas, state["answer"])]


if __name__ == "__main__":
    from common import backend_from_args

    for question, answer, truth in main(backend_from_args(__doc__)):
        print(f"{question} -> {answer}   (truth: {truth})")
