"""The paper's multi-dimensional essay judge, on a picture: is the essay (a description someone wrote)
about this image? Each dimension is judged in its own fork of the image and essay; the judgments are
merged and a grade comes out as JSON constrained by a regex."""

import vlserve.lang as sgl

DIMENSIONS = ("shape", "count", "position")  # each judged by a question about the picture itself
GRADE_REGEX = r'\{"grade": "[ABCDF]", "related": "(yes|no)"\}'


@sgl.function
def essay_judge(s, picture, essay, questions):
    s += sgl.user(sgl.image(picture) + "Describe the image in one sentence.")
    s += sgl.assistant(" " + essay)
    s += sgl.user("Is the description right?")
    s += sgl.assistant(sgl.select("related", choices=[" yes", " no"]))
    forks = s.fork(len(questions))
    forks += lambda i: sgl.user(questions[i]) + sgl.assistant(sgl.gen("judgment", max_tokens=24))
    forks.join()
    agree = sum(j.strip().lower() in essay.lower() for j in s["judgment"])
    s += sgl.user("Judgments: " + "; ".join(j.strip() for j in s["judgment"]) + f". {agree} agree. Grade it.")
    s += sgl.assistant(sgl.gen("grade", max_tokens=24, regex=GRADE_REGEX))
    s["agree"] = agree


def main(backend, seeds=range(60, 64)) -> list[dict]:
    from common import scene

    batch = []
    for seed in seeds:
        picture, qas = scene(seed)
        caption = next(qa.answer for qa in qas if qa.qtype == "caption")
        questions = [next(qa.question for qa in qas if qa.qtype == d) for d in DIMENSIONS]
        essay = caption if seed % 2 == 0 else "A blue square on a white background."
        batch.append({"picture": picture, "essay": essay, "questions": questions})
    states = essay_judge.run_batch(batch, temperature=0, backend=backend)
    return [{"essay": b["essay"], "related": s["related"].strip(), "judgments": [j.strip() for j in s["judgment"]],
             "agree": s["agree"], "grade": s["grade"]} for b, s in zip(batch, states)]


if __name__ == "__main__":
    from common import backend_from_args

    for result in main(backend_from_args(__doc__)):
        print(result)
