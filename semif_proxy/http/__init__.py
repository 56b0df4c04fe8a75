"""The aiohttp server: the app factory (wiring only), middleware, auth, body reading,
admission, app keys, metrics, start-up and shutdown (`lifecycle`), JSON Lines calls, the
routes and the playground's static files."""
