"""The gateway side of the OpenAI Responses API: body checks (``checks``), one request
made ready for a chat upstream (``turns``), a native upstream's stream relayed
(``native_relay``), the stored responses and their routes (``stored``), and who may use
a stored response (``owners``). ``POST /v1/responses`` itself is an inference route
(``reef.gateway.inference``).

The upstream side, translation to chat completions and the Responses event stream, is
``reef.upstream.responses``."""
