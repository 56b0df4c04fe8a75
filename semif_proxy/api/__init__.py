"""The two decision APIs as services with one shape: the decisions API and TypeSafe's System One
API, their request schemas, option rotations, the rows log and the body shapes that tell them
apart. Runs on the engine; never imports the HTTP layer."""
