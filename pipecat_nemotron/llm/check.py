"""One look at the LLM endpoint when a session starts: an unreachable server is named, not just a connection error.

The OpenAI client reports an unreachable server as ``Connection error.`` at the first user turn, without the URL.
:func:`check_llm_endpoint` asks the server for its models once (``GET <base_url>/models``, the route vLLM, NIM,
llama.cpp and the hosted API all serve) and logs an error that names the URL and what to check. Any HTTP answer
but an authentication refusal counts as reachable: the check is about the network, not the route.
"""

from __future__ import annotations

from loguru import logger

__all__ = ["DEFAULT_CHECK_TIMEOUT_S", "check_llm_endpoint"]

#: How long the check waits for the server's answer, seconds.
DEFAULT_CHECK_TIMEOUT_S = 3.0


async def check_llm_endpoint(
    base_url: str, api_key: str | None = None, timeout_s: float = DEFAULT_CHECK_TIMEOUT_S
) -> str | None:
    """Check once that the OpenAI-compatible server at ``base_url`` answers; log an error naming it if not.

    Args:
        base_url: The API root (``http://localhost:8000/v1``).
        api_key: Bearer token sent with the request (None or ``"none"``: no header).
        timeout_s: How long to wait for the answer, seconds.

    Returns:
        None when the server answered, else the error message that was logged.

    """
    import httpx

    url = base_url.rstrip("/") + "/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key and api_key.lower() != "none" else {}
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            response = await client.get(url, headers=headers)
    except httpx.TimeoutException:
        problem = f"did not answer within {timeout_s:g} s"
    except httpx.HTTPError as e:
        problem = f"cannot be reached ({type(e).__name__}: {e or 'no detail'})"
    else:
        if response.status_code not in (401, 403):
            return None
        problem = f"refused the API key (HTTP {response.status_code}); check NEMOTRON_LLM_API_KEY"
    message = (
        f"The LLM server at {base_url} {problem}. The agent will not answer until it does: start the server "
        "or fix NEMOTRON_LLM_BASE_URL (see docs/LLM.md)."
    )
    logger.error(message)
    return message
