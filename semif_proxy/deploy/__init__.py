"""SageMaker deployment tooling (boto3; install the `[aws]` extra). Each module is one step:
package the model, build the image, run the endpoint."""
