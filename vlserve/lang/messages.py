"""A finished role as an OpenAI chat message (the OpenAI backend's chat models read s.messages())."""


def role_message(role: str, body: str, media: list, template) -> dict:
    """Media tokens leave the text; each image or video becomes a content part, before the text."""
    text = body.replace(template.image_token, "").replace(template.video_token, "").strip()
    if not media:
        return {"role": role, "content": text}
    parts = [_media_part(item) for item in media]
    return {"role": role, "content": parts + [{"type": "text", "text": text}]}


def _media_part(item) -> dict:
    if item.kind == "video":
        return {"type": "video_url", "video_url": {"url": item.data_uri()}}
    return {"type": "image_url", "image_url": {"url": item.data_uri()}}
