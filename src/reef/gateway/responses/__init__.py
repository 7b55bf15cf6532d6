"""The gateway side of the OpenAI Responses API: body checks (``checks``), one request
made ready for a chat upstream (``turns``), the stored responses and their routes
(``stored``), who may use a stored response (``owners``) and the receipt a stream's
terminal event carries (``receipt``). ``POST /v1/responses`` itself is an inference
route (``reef.gateway.inference``).

The upstream side, translation to chat completions, the Responses event stream and the
relays that carry an upstream's stream to a Responses client, is
``reef.upstream.responses``."""
