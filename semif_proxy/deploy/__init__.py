"""SageMaker deployment tooling (boto3; install the `[aws]` extra). Each module is one step:
package the model, build the image, create the model, run the endpoint (async config,
autoscaling, instance types), invoke it asynchronously, run a Batch Transform job."""
