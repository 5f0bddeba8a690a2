"""The Kubernetes Job an attempt runs as: valid against the official schemas (kubernetes-validate,
strict) for every flavour and market, and saying what the provider relies on: no retries behind
the controller's back, GPUs requested and limited, spot placement, grace from the notice budget,
checkpoints off the pod, secrets by reference only."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from spotwise.control.providers.kube_manifest import (
    GPU,
    KubernetesOptions,
    KueueOptions,
    dns_name,
    job_manifest,
    service,
)

K8S_VERSION = "1.31"


def build(market: str = "spot", gpus: int = 1, **options: Any) -> dict[str, Any]:
    opts = KubernetesOptions(image="ghcr.io/me/train:1", checkpoint_pvc="ckpt", **options)
    return job_manifest(
        opts,
        name="spotwise-digits-0a1b2c-3",
        namespace="ml",
        job_id="digits-0a1b2c",
        n=3,
        argv=["python", "train.py"],
        env={"PYTHONUNBUFFERED": "1"},
        workdir="/app",
        market=market,
        gpu_count=gpus,
        cpus=4,
    )


def pod_spec(manifest: dict[str, Any]) -> dict[str, Any]:
    return manifest["spec"]["template"]["spec"]


@pytest.mark.parametrize("flavour", ["gke", "eks", "aks", None])
@pytest.mark.parametrize("market", ["spot", "on-demand"])
def test_every_generated_job_passes_the_official_schema(flavour, market):
    manifest = build(
        market,
        flavour=flavour,
        memory="8Gi",
        service_account="trainer",
        image_pull_secrets=["regcred"],
        secret_env={"HF_TOKEN": "hf/token"},
        node_selector={"pool": "gpu"},
        tolerations=[{"key": "team", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
    )
    assert kubernetes_validate.validate(manifest, K8S_VERSION, strict=True) == K8S_VERSION


def test_the_validator_does_reject_a_broken_job():
    manifest = build()
    broken = copy.deepcopy(manifest)
    broken["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"] = ["seventy-five"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)
    unknown = copy.deepcopy(manifest)
    pod_spec(unknown)["terminationGraceSeconds"] = 30  # a typo of a real field
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(unknown, K8S_VERSION, strict=True)


def test_preemption_and_exit_75_fail_the_job_instead_of_being_retried():
    spec = build()["spec"]
    assert spec["backoffLimit"] == 0 and spec["podReplacementPolicy"] == "Failed"
    rules = spec["podFailurePolicy"]["rules"]
    assert {
        "action": "FailJob",
        "onExitCodes": {"containerName": "train", "operator": "In", "values": [75]},
    } in rules
    assert {
        "action": "FailJob",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    } in rules
    assert pod_spec(build())["restartPolicy"] == "Never"


def test_gpus_are_requested_and_limited_and_their_taint_tolerated():
    spec = pod_spec(build(gpus=2))
    resources = spec["containers"][0]["resources"]
    assert resources["requests"][GPU] == resources["limits"][GPU] == "2"
    assert {"key": GPU, "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    cpu_only = pod_spec(build(gpus=0))
    assert GPU not in cpu_only["containers"][0]["resources"]["requests"]
    assert "tolerations" not in cpu_only


@pytest.mark.parametrize(
    ("flavour", "label", "value"),
    [
        ("gke", "cloud.google.com/gke-spot", "true"),
        ("eks", "eks.amazonaws.com/capacityType", "SPOT"),
        ("aks", "kubernetes.azure.com/scalesetpriority", "spot"),
    ],
)
def test_spot_attempts_go_to_spot_nodes_and_on_demand_ones_keep_off_them(flavour, label, value):
    spot = pod_spec(build("spot", flavour=flavour))
    assert spot["nodeSelector"][label] == value
    aks_taint = {"key": label, "operator": "Equal", "value": value, "effect": "NoSchedule"}
    assert (aks_taint in spot["tolerations"]) == (flavour == "aks")
    on_demand = pod_spec(build("on-demand", flavour=flavour))
    assert label not in on_demand.get("nodeSelector", {})
    [term] = on_demand["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": label, "operator": "NotIn", "values": [value]}]
    assert aks_taint not in on_demand.get("tolerations", [])


def test_user_selectors_and_tolerations_are_kept():
    spec = pod_spec(
        build(node_selector={"pool": "a100"}, tolerations=[{"key": "x", "operator": "Exists"}])
    )
    assert spec["nodeSelector"] == {"pool": "a100"}
    assert {"key": "x", "operator": "Exists"} in spec["tolerations"]


@pytest.mark.parametrize(("flavour", "grace"), [("gke", 15), ("eks", 110), ("aks", 25), (None, 30)])
def test_grace_period_is_the_notice_budget(flavour, grace):
    assert pod_spec(build(flavour=flavour))["terminationGracePeriodSeconds"] == grace
    assert pod_spec(build(flavour=flavour, grace_s=42))["terminationGracePeriodSeconds"] == 42


def test_checkpoints_live_on_the_claim_and_secrets_are_references():
    manifest = build(secret_env={"AWS_SECRET_ACCESS_KEY": "aws-creds/secret"})
    spec = pod_spec(manifest)
    assert spec["volumes"] == [
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "ckpt"}}
    ]
    container = spec["containers"][0]
    assert container["volumeMounts"] == [{"name": "checkpoints", "mountPath": "/checkpoints"}]
    [secret] = [e for e in container["env"] if e["name"] == "AWS_SECRET_ACCESS_KEY"]
    assert secret == {
        "name": "AWS_SECRET_ACCESS_KEY",
        "valueFrom": {"secretKeyRef": {"name": "aws-creds", "key": "secret"}},
    }
    assert spec["automountServiceAccountToken"] is False
    labels = manifest["metadata"]["labels"]
    assert labels["spotwise.dev/job"] == "digits-0a1b2c" and labels["spotwise.dev/attempt"] == "3"
    assert manifest["spec"]["template"]["metadata"]["labels"] == labels


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("secret_env", {"TOKEN": "hunter2"}, "not a secret reference"),
        ("secret_env", {"9X": "a/b"}, "not an environment variable name"),
        ("checkpoint_mount", "relative/dir", "absolute path"),
        ("flavour", "openshift", "gke"),
        ("grace_s", 0, "greater than 0"),
    ],
)
def test_bad_options_are_refused_naming_the_problem(option, value, words):
    with pytest.raises(ValueError, match=words):
        KubernetesOptions(image="x", **{option: value})


def test_object_names_are_dns_labels():
    assert dns_name("spotwise-My_Job.v2-ab12cd-10") == "spotwise-my-job-v2-ab12cd-10"
    assert len(dns_name("spotwise-" + "x" * 80)) == 63


def test_a_two_node_attempt_is_an_indexed_job_in_its_services_subdomain_and_kueue_suspends_it():
    opts = KubernetesOptions(image="ghcr.io/me/train:1", checkpoint_pvc="ckpt")
    queued = opts.model_copy(update={"kueue": KueueOptions(queue="team-a")})
    name = dns_name("spotwise-" + "x" * 70 + "-3", nodes=12)
    assert len(f"{name}-11") == 63  # every pod's host name is a DNS label
    job = job_manifest(
        queued, name=name, namespace="ml", job_id="j", n=3, argv=["python", "train.py"],
        env={}, workdir="/app", market="spot", gpu_count=1, cpus=4, nodes=12,
    )  # fmt: skip
    svc = service(opts, name=name, namespace="ml", job_id="j", n=3)
    for manifest in (job, svc):
        assert kubernetes_validate.validate(manifest, K8S_VERSION, strict=True) == K8S_VERSION
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 12, 12)
    assert pod_spec(job)["subdomain"] == name == svc["metadata"]["name"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"]
    assert svc["spec"]["selector"] == {"spotwise.dev/job": "j", "spotwise.dev/attempt": "3"}
    assert spec["suspend"] is True  # Kueue unsuspends it on admission
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    alone = build()
    assert "suspend" not in alone["spec"] and "completionMode" not in alone["spec"]
