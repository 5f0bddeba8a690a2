import boto3


def test_moto_server_speaks_s3_on_loopback(aws_env):
    assert aws_env.startswith("http://127.0.0.1:")
    s3 = boto3.client("s3", endpoint_url=aws_env)
    s3.create_bucket(Bucket="fixture-check")
    s3.put_object(Bucket="fixture-check", Key="a", Body=b"hello")
    assert s3.get_object(Bucket="fixture-check", Key="a")["Body"].read() == b"hello"
