// Follows one of rem's event streams with the WHATWG EventSource of the npm `eventsource` package
// (a client no one here wrote: its own parsing, Last-Event-ID and reconnection), printing each event
// it dispatches as one JSON line on stdout and each (re)connection or error on stderr; exits once it
// has seen STOP_COUNT events of type STOP_TYPE.
//
//   REM_EVENTSOURCE_MODULE=file:///.../eventsource/dist/index.js REM_TEST_TOKEN=... \
//     node eventsource_follow.mjs URL TYPE,TYPE,... STOP_TYPE STOP_COUNT
//
// The token comes from the environment, never argv (`ps` shows argv to every user).
const { EventSource } = await import(process.env.REM_EVENTSOURCE_MODULE);
const [url, types, stopType, stopCount] = process.argv.slice(2);
const token = process.env.REM_TEST_TOKEN;
const authorized = (input, init) =>
  fetch(input, { ...init, headers: { ...init.headers, Authorization: `Bearer ${token}` } });
const source = new EventSource(url, { fetch: authorized });
let stops = 0;
for (const type of types.split(",")) {
  source.addEventListener(type, (event) => {
    process.stdout.write(JSON.stringify({ id: event.lastEventId, type, data: JSON.parse(event.data) }) + "\n");
    if (type === stopType && ++stops >= Number(stopCount)) {
      source.close();
      process.exit(0);
    }
  });
}
source.onopen = () => process.stderr.write("open\n");
source.onerror = (event) => process.stderr.write(`error: ${event.message ?? "connection lost"}\n`);
