"""SageMaker deployment tooling (boto3; install the `[aws]` extra). `cli` reads the
subcommands' flags and `actions` does what each asks; the other modules are one step each:
package the model, build the image, create the model (`deployment` its settings and configs,
`resources` one SageMaker resource looked up or deleted), run the endpoint (async config,
autoscaling, instance types), invoke it asynchronously, run a Batch Transform job."""
