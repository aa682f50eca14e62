"""deploy/kubernetes rendered offline with `kubectl kustomize` (no cluster), core kinds validated against the
Kubernetes schemas (kubernetes-validate), KServe's custom resources checked field by field."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.conftest import ROOT
from tests.deploy.compose import IMAGE, IMAGE_FRONTS, IMAGE_PYTHON, TRITON_IMAGE_DIR, image_pins

KUBERNETES = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("overlays/cpu", "overlays/gpu")
# overlays/llm (the language model and its OpenAI-compatible API) has checks of its own, against the CPU overlay.
RENDERED = (*OVERLAYS, "kserve", "prometheus-adapter", "overlays/llm")
# The oldest Kubernetes still offered by the big managed services, and the newest the validator knows.
KUBERNETES_VERSIONS = ("1.27.0", kubernetes_validate.latest_version())
CUSTOM_GROUPS = ("serving.kserve.io/",)
# What the kustomize inside Debian's kubectl 1.20 (v2.0.3, the fallback of `make system`) understands; newer
# kustomize reads all of it too.
KUSTOMIZE_V2_FIELDS = {"resources", "bases", "namespace", "namePrefix", "nameSuffix", "commonLabels",
                       "commonAnnotations", "configMapGenerator", "secretGenerator", "generatorOptions",
                       "patchesStrategicMerge", "patchesJson6902", "images", "vars", "crds"}
ADMIN_SECRET = "skill2triton-admin-key"
LABELS = {"app.kubernetes.io/name": "skill2triton", "app.kubernetes.io/component": "triton"}


def _kubectl() -> str:
    exe = shutil.which("kubectl")
    if exe is None:
        pytest.fail("kubectl is not installed; `make system` installs it (Debian package kubernetes-client)")
    return exe


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    out = {}
    for directory in RENDERED:
        result = subprocess.run([_kubectl(), "kustomize", str(KUBERNETES / directory)], capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 0, f"kubectl kustomize {directory}:\n{result.stderr}"
        out[directory] = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    return out


def one(docs: list[dict], kind: str) -> dict:
    found = [doc for doc in docs if doc["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind}"
    return found[0]


def container(deployment: dict, name: str = "triton") -> dict:
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def test_every_kustomization_uses_only_fields_kustomize_v2_knows():
    for path in KUBERNETES.rglob("kustomization.yaml"):
        unknown = set(yaml.safe_load(path.read_text())) - KUSTOMIZE_V2_FIELDS
        assert not unknown, f"{path.relative_to(ROOT)}: {sorted(unknown)}"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("directory", RENDERED)
def test_core_kinds_are_valid_against_the_kubernetes_schema(rendered, directory, version):
    core = [doc for doc in rendered[directory] if not doc["apiVersion"].startswith(CUSTOM_GROUPS)]
    assert core or directory == "kserve"
    for doc in core:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{directory}: {doc['kind']}/{doc['metadata']['name']}: {err.message}")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_an_overlay_holds_deployment_service_autoscaler_and_disruption_budget_in_one_namespace(rendered, overlay):
    docs = rendered[overlay]
    assert {doc["kind"] for doc in docs} == {"Deployment", "Service", "HorizontalPodAutoscaler",
                                             "PodDisruptionBudget", "ConfigMap", "ServiceAccount"}
    assert {doc["metadata"]["namespace"] for doc in docs} == {"skill2triton"}


def _pushed(image: str) -> str:
    """The image's name and tag without the registry that `images:` in the kustomizations puts in front."""
    registry, _, name = image.rpartition("/")
    assert registry, f"{image}: no registry, so it would be pulled from Docker Hub"
    return name


@pytest.mark.parametrize("directory", RENDERED[:3])
def test_pods_run_the_compose_serving_image_which_installs_what_their_repositories_import(rendered, directory):
    from s2t.gate.runtime_imports import BACKEND_MODULES, distribution_of, model_files, third_party_modules

    for triton in triton_containers(rendered[directory]):
        # The serving target, or the llm one (tag `-llm`) where the language model is served.
        target = "llm" if _pushed(triton["image"]).endswith("-llm") else "serving"
        installed = image_pins(TRITON_IMAGE_DIR / "Dockerfile", target)
        assert _pushed(triton["image"]) == IMAGE + ("" if target == "serving" else f"-{target}")
        # A release holds these folders under the names they have here.
        served = [ROOT / Path(arg.split("=", 1)[1]).name for arg in triton["args"]
                  if arg.startswith("--model-repository=")]
        assert served and all(folder.is_dir() for folder in served), served
        for module in third_party_modules(ROOT, model_files(served)):
            if module.split(".")[0] not in BACKEND_MODULES:
                assert distribution_of(module) in installed, f"{directory}: {module} is not in the image"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_triton_is_the_pinned_image_probed_on_live_and_ready_with_requests_and_limits(rendered, overlay):
    triton = container(one(rendered[overlay], "Deployment"))
    assert _pushed(triton["image"]) == IMAGE
    assert triton["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert triton["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    ports = {p["name"]: p["containerPort"] for p in triton["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002, "supervisor": 8003}
    assert triton["readinessProbe"]["httpGet"]["port"] == "http"
    assert {"cpu", "memory"} <= set(triton["resources"]["requests"])
    assert triton["resources"]["limits"]["memory"] == triton["resources"]["requests"]["memory"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_repository_comes_from_a_synced_volume_with_the_backends_on_the_stub_path(rendered, overlay):
    docs = rendered[overlay]
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    sync = pod["initContainers"][0]
    synced = next(m["mountPath"] for m in sync["volumeMounts"] if m["name"] == "models")
    triton = container(one(docs, "Deployment"))
    args = triton["args"]
    repositories = [a.split("=", 1)[1] for a in args if a.startswith("--model-repository=")]
    gpu_repository = [f"{synced}/model_repository_gpu"] if overlay == "overlays/gpu" else []
    assert repositories == [f"{synced}/model_repository", f"{synced}/ensembles"] + gpu_repository
    mounts = {m["mountPath"]: m for m in triton["volumeMounts"]}
    assert mounts[synced]["readOnly"] is True, "the server never writes its repository"
    pth = mounts[f"/usr/local/lib/python{IMAGE_PYTHON}/dist-packages/skill2triton.pth"]
    volume = next(v for v in pod["volumes"] if v["name"] == pth["name"])
    config_map = next(d for d in docs if d["kind"] == "ConfigMap"
                      and d["metadata"]["name"] == volume["configMap"]["name"])
    assert config_map["data"][pth["subPath"]] == f"{synced}/src"
    source = next(d for d in docs if d["kind"] == "ConfigMap"
                  and d["metadata"]["name"] == sync["envFrom"][0]["configMapRef"]["name"])
    assert "$(SOURCE)" in sync["args"] and source["data"]["SOURCE"]


@pytest.mark.parametrize("directory", RENDERED[:3])
def test_every_triton_restricts_repository_shared_memory_logging_and_trace_to_the_key_on_both_protocols(
        rendered, directory):
    from s2t.serve.restricted_apis import restrict
    for triton in triton_containers(rendered[directory]):
        args = triton["args"]
        # Complete as written: the keeper, which would add what is missing, has nothing to add.
        assert restrict(args) == args, [a for a in restrict(args) if a not in args]
        for option in ("--http-restricted-api=", "--grpc-restricted-protocol="):
            assert [a for a in args if a.startswith(option) and a.endswith(":admin-key=$$(S2T_ADMIN_KEY)")], option


@pytest.mark.parametrize("directory", RENDERED[:3])
def test_every_triton_keeps_the_latency_summaries_s2t_serve_keeps_with_the_flag(rendered, directory):
    from s2t.serve.triton_server import LATENCY_SUMMARY_ARGS
    for triton in triton_containers(rendered[directory]):
        assert [a for a in triton["args"] if a.startswith("--metrics-config=")] == LATENCY_SUMMARY_ARGS


@pytest.mark.parametrize("directory", RENDERED[:3])
def test_every_triton_reads_no_request_larger_than_its_models_can_use(rendered, directory):
    from tests.conftest import ENSEMBLES, MODEL_REPOSITORY
    from s2t.serve.request_limits import http_max_input_bytes
    limit = http_max_input_bytes([MODEL_REPOSITORY, ENSEMBLES, ROOT / "model_repository_gpu"])
    for triton in triton_containers(rendered[directory]):
        assert f"--http-max-input-size={limit}" in triton["args"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_explicit_mode_takes_the_admin_key_from_a_secret_that_is_not_committed(rendered, overlay):
    docs = rendered[overlay]
    triton = container(one(docs, "Deployment"))
    args = triton["args"]
    assert "--model-control-mode=explicit" in args
    restricted = "model-repository,shared-memory,logging,trace:admin-key=$$(S2T_ADMIN_KEY)"
    assert f"--http-restricted-api={restricted}" in args
    assert f"--grpc-restricted-protocol={restricted}" in args
    # The kubelet unescapes `$$(` to `$(` and leaves it: the keeper replaces it, off the command line.
    from s2t.serve.keeper import ADMIN_KEY_REFERENCE
    assert ADMIN_KEY_REFERENCE == "$(S2T_ADMIN_KEY)"
    env = {e["name"]: e for e in triton["env"]}
    ref = env["S2T_ADMIN_KEY"]["valueFrom"]["secretKeyRef"]
    assert ref["name"] == ADMIN_SECRET and ref["optional"] is False
    assert not [d for d in docs if d["kind"] == "Secret"], "no Secret, and so no key, in the repository"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_and_disruption_budget_select_the_triton_pods(rendered, overlay):
    docs = rendered[overlay]
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert one(docs, "Service")["spec"]["selector"].items() <= pod_labels.items()
    assert one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert LABELS.items() <= pod_labels.items()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_autoscaler_scales_the_deployment_on_queue_metrics_the_adapter_defines(rendered, overlay):
    docs = rendered[overlay]
    hpa = one(docs, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": one(docs, "Deployment")["metadata"]["name"]}
    used = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"}
    assert used, "no Pods metric"
    adapter = one(rendered["prometheus-adapter"], "ConfigMap")
    rules = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    assert used <= {rule["name"]["as"] for rule in rules}
    assert all("nv_inference_" in rule["seriesQuery"] for rule in rules)
    assert hpa["spec"]["minReplicas"] >= 1 and hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"]


def test_the_gpu_overlay_asks_one_gpu_per_pod_and_the_cpu_overlay_none(rendered):
    gpu = container(one(rendered["overlays/gpu"], "Deployment"))["resources"]
    assert gpu["limits"]["nvidia.com/gpu"] == "1" and gpu["requests"]["nvidia.com/gpu"] == "1"
    cpu = container(one(rendered["overlays/cpu"], "Deployment"))["resources"]
    assert "nvidia.com/gpu" not in {**cpu.get("limits", {}), **cpu["requests"]}


def test_only_the_gpu_overlay_serves_the_gpu_repository_beside_the_base_ones(rendered):
    gpu_args = container(one(rendered["overlays/gpu"], "Deployment"))["args"]
    cpu_args = container(one(rendered["overlays/cpu"], "Deployment"))["args"]
    assert gpu_args == cpu_args + ["--model-repository=/models/model_repository_gpu"]


def named(docs: list[dict], kind: str, name: str) -> dict:
    return next(doc for doc in docs if doc["kind"] == kind and doc["metadata"]["name"] == name)


def test_the_kserve_variant_carries_a_canary_share_on_its_own_pinned_triton_runtime(rendered):
    docs = rendered["kserve"]
    service = named(docs, "InferenceService", "skill2triton")
    assert service["apiVersion"] == "serving.kserve.io/v1beta1"
    assert service["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Serverless"
    predictor = service["spec"]["predictor"]
    assert 0 <= predictor["canaryTrafficPercent"] <= 100
    model = predictor["model"]
    assert model["modelFormat"]["name"] == "triton" and model["storageUri"].startswith(("s3://", "gs://"))
    assert model["env"][0]["valueFrom"]["secretKeyRef"]["name"] == ADMIN_SECRET
    runtime = named(docs, "ServingRuntime", model["runtime"])
    assert runtime["apiVersion"] == "serving.kserve.io/v1alpha1"
    assert runtime["metadata"]["name"] == model["runtime"]
    assert "triton" in {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    assert _pushed(runtime["spec"]["containers"][0]["image"]) == IMAGE
    mounts = {m["name"]: m for m in model["volumeMounts"]}
    volumes = {v["name"]: v for v in predictor["volumes"]}
    pth = one(docs, "ConfigMap")
    assert volumes[mounts["pth"]["name"]]["configMap"]["name"] == pth["metadata"]["name"]
    args = runtime["spec"]["containers"][0]["args"]
    src = Path(pth["data"]["skill2triton.pth"])
    assert f"--model-repository={src.parent}/model_repository" in args


def test_nothing_under_deploy_kubernetes_holds_a_secret_value():
    for path in KUBERNETES.rglob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict):
                assert doc.get("kind") != "Secret", path
                assert "secretGenerator" not in doc, path


KEEPER = ["/opt/nvidia/nvidia_entrypoint.sh", "python3", "-m", "s2t.serve.keeper"]


def triton_containers(docs: list[dict]) -> list[dict]:
    runtimes = [doc["spec"]["containers"][0] for doc in docs if doc["kind"] == "ServingRuntime"]
    return runtimes or [container(one(docs, "Deployment"))]


@pytest.mark.parametrize("directory", RENDERED[:3])
def test_tritonserver_runs_under_the_keeper_which_the_release_source_provides(rendered, directory):
    for triton in triton_containers(rendered[directory]):
        command = triton["command"]
        assert command[:4] == KEEPER and command[-2:] == ["--", "tritonserver"], command
        # The public ports are the fronts' (built into the image), Triton's own endpoints on loopback behind them.
        assert f"--fronts={IMAGE_FRONTS}" in command, command
        state_dir = next(a.split("=", 1)[1] for a in command if a.startswith("--state-dir="))
        if directory != "kserve":
            assert state_dir in {m["mountPath"] for m in triton["volumeMounts"]}, "supervisor.json needs a place"
    assert (ROOT / "s2t" / "serve" / "keeper.py").is_file()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_autoscaler_also_scales_on_cpu_above_80_percent_of_the_request(rendered, overlay):
    docs = rendered[overlay]
    hpa = one(docs, "HorizontalPodAutoscaler")
    cpu = [m["resource"] for m in hpa["spec"]["metrics"] if m["type"] == "Resource"]
    assert cpu == [{"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}]
    # Utilization is relative to the request: the container must have one.
    assert container(one(docs, "Deployment"))["resources"]["requests"]["cpu"]
    assert {m["type"] for m in hpa["spec"]["metrics"]} == {"Pods", "Resource"}, "the queue metrics stay"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_run_as_non_root_without_privileges_under_a_storage_service_account(rendered, overlay):
    docs = rendered[overlay]
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    for c in pod["initContainers"] + pod["containers"]:
        security = c["securityContext"]
        assert security["allowPrivilegeEscalation"] is False and security["capabilities"]["drop"] == ["ALL"], c["name"]
        assert security["readOnlyRootFilesystem"] is True, c["name"]
    account = one(docs, "ServiceAccount")
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert pod["automountServiceAccountToken"] is False


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_leave_the_service_before_sigterm_and_spread_over_zones_and_nodes(rendered, overlay):
    deployment = one(rendered[overlay], "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    pause = container(deployment)["lifecycle"]["preStop"]["exec"]["command"]
    assert pause[0] == "sleep" and int(pause[1]) > 0
    exit_timeout = int(next(a for a in container(deployment)["args"] if a.startswith("--exit-timeout-secs="))
                       .split("=")[1])
    assert pod["terminationGracePeriodSeconds"] > int(pause[1]) + exit_timeout
    spread = {c["topologyKey"]: c for c in pod["topologySpreadConstraints"]}
    assert set(spread) == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert all(c["labelSelector"]["matchLabels"].items() <= labels.items() for c in spread.values())


def release_references(docs: list[dict]) -> list[str]:
    found = [d["data"]["SOURCE"] for d in docs if d["kind"] == "ConfigMap" and "SOURCE" in d.get("data", {})]
    found += [d["spec"]["predictor"]["model"]["storageUri"] for d in docs if d["kind"] == "InferenceService"]
    return found


@pytest.mark.parametrize("directory", RENDERED[:3])
def test_every_pod_names_one_immutable_release_by_its_content_id(rendered, directory):
    from s2t.control.release import ID_PATTERN
    references = release_references(rendered[directory])
    assert references
    ids = {ref.rsplit("/releases/", 1)[1] for ref in references}
    assert len(ids) == 1 and ID_PATTERN.fullmatch(ids.pop()), references
    if directory != "kserve":
        # The pod template names the release's ConfigMap by its hashed name: a new release is a new template,
        # so it rolls out, and `kubectl rollout undo` brings the previous release back.
        deployment = one(rendered[directory], "Deployment")
        init = deployment["spec"]["template"]["spec"]["initContainers"][0]
        config_map = next(d for d in rendered[directory] if d["kind"] == "ConfigMap" and "SOURCE" in d["data"])
        assert init["envFrom"][0]["configMapRef"]["name"] == config_map["metadata"]["name"] != "skill2triton-repository"


def test_a_pinned_release_changes_the_pod_template_and_every_reference(tmp_path, built_artifacts):
    from s2t.control import release
    copy = tmp_path / "kubernetes"
    shutil.copytree(KUBERNETES, copy)
    release_id = release.build(ROOT, [ROOT / "model_repository", ROOT / "ensembles"], tmp_path / "releases")
    assert release.pin(copy, release_id)
    for directory in ("overlays/cpu", "kserve"):
        out = subprocess.run([_kubectl(), "kustomize", str(copy / directory)], capture_output=True, text=True,
                             timeout=60, check=True).stdout
        docs = [d for d in yaml.safe_load_all(out) if d]
        assert {ref.rsplit("/releases/", 1)[1] for ref in release_references(docs)} == {release_id}
    before = one([d for d in yaml.safe_load_all(subprocess.run(
        [_kubectl(), "kustomize", str(KUBERNETES / "overlays/cpu")], capture_output=True, text=True,
        check=True).stdout) if d], "Deployment")["spec"]["template"]
    after = one([d for d in yaml.safe_load_all(subprocess.run(
        [_kubectl(), "kustomize", str(copy / "overlays/cpu")], capture_output=True, text=True,
        check=True).stdout) if d], "Deployment")["spec"]["template"]
    assert before != after, "a new release must roll out as a new pod template"


def test_kserve_serves_grpc_beside_http_from_the_same_release(rendered):
    docs = rendered["kserve"]
    http_service = named(docs, "InferenceService", "skill2triton")
    grpc_service = named(docs, "InferenceService", "skill2triton-grpc")
    http_model, grpc_model = http_service["spec"]["predictor"]["model"], grpc_service["spec"]["predictor"]["model"]
    assert grpc_model["storageUri"] == http_model["storageUri"]
    assert grpc_service["spec"]["predictor"]["canaryTrafficPercent"] == \
        http_service["spec"]["predictor"]["canaryTrafficPercent"]
    assert grpc_model["protocolVersion"] == "grpc-v2"
    runtime = named(docs, "ServingRuntime", grpc_model["runtime"])["spec"]["containers"][0]
    assert runtime["ports"] == [{"name": "h2c", "containerPort": 8081, "protocol": "TCP"}]
    assert "--grpc-port=8081" in runtime["args"]
    assert any(a.startswith("--grpc-restricted-protocol=") for a in runtime["args"])
    for model in (http_model, grpc_model):
        assert model["securityContext"]["runAsNonRoot"] is True


def test_the_llm_overlay_is_the_cpu_one_plus_the_llm_repository_and_the_openai_api_on_a_probed_port(rendered):
    from s2t.control.release import ENTRY_MODULES, project_files
    from s2t.serve.keeper import serves_openai_model
    cpu, llm = (container(one(rendered[d], "Deployment")) for d in ("overlays/cpu", "overlays/llm"))
    assert _pushed(llm["image"]) == f"{IMAGE}-llm", "deploy/triton's llm target, tagged as in docker-compose.yml"
    # Same server, same restricted APIs and admin key: only the language model's repository added.
    assert llm["args"] == cpu["args"] + ["--model-repository=/models/model_repository_llm"]
    assert llm["env"] == cpu["env"]
    served = [str(ROOT / Path(a.split("=", 1)[1]).name) for a in llm["args"] if a.startswith("--model-repository=")]
    assert serves_openai_model(served) and not serves_openai_model(
        [str(ROOT / Path(a.split("=", 1)[1]).name) for a in cpu["args"] if a.startswith("--model-repository=")])
    port = int(next(a.split("=", 1)[1] for a in llm["command"] if a.startswith("--openai-port=")))
    assert [a for a in llm["command"] if not a.startswith("--openai-port=")] == cpu["command"]
    ports = {p["name"]: p["containerPort"] for p in llm["ports"]}
    assert ports == {**{p["name"]: p["containerPort"] for p in cpu["ports"]}, "openai": port}
    # /v1/models answers only while Triton is ready: one probe covers the API and the server behind it.
    assert llm["readinessProbe"]["httpGet"] == {"path": "/v1/models", "port": "openai"}
    assert llm["readinessProbe"]["timeoutSeconds"] >= 4, "the API asks Triton within 3 s before it answers"
    assert llm["livenessProbe"] == cpu["livenessProbe"] and llm["startupProbe"] == cpu["startupProbe"]
    service = one(rendered["overlays/llm"], "Service")
    assert {"name": "openai", "port": port, "targetPort": "openai"} in service["spec"]["ports"]
    # The keeper runs from the release's src/: the API's module travels with it.
    entries = [ROOT / (module.replace(".", "/") + ".py") for module in ENTRY_MODULES]
    assert ROOT / "s2t" / "serve" / "openai_server.py" in project_files(ROOT, entries)


def test_the_llm_image_installs_what_the_llm_overlay_imports(rendered):
    from s2t.gate.runtime_imports import BACKEND_MODULES, distribution_of, model_files, third_party_modules
    installed = image_pins(TRITON_IMAGE_DIR / "Dockerfile", "llm")
    triton = container(one(rendered["overlays/llm"], "Deployment"))
    served = [ROOT / Path(a.split("=", 1)[1]).name for a in triton["args"] if a.startswith("--model-repository=")]
    imported = third_party_modules(ROOT, model_files(served) + [ROOT / "s2t" / "serve" / "keeper.py"])
    assert "aiohttp" in imported and "xllamacpp" in {m.split(".")[0] for m in imported}
    for module in imported:
        if module.split(".")[0] not in BACKEND_MODULES:
            assert distribution_of(module) in installed, f"{module} is not in the llm image"


def test_kserve_serves_the_openai_api_from_the_same_release_on_the_llm_image_probed_on_v1_models(rendered):
    from s2t.serve.keeper import serves_openai_model
    docs = rendered["kserve"]
    http_service, openai_service = (named(docs, "InferenceService", name)
                                    for name in ("skill2triton", "skill2triton-openai"))
    http_model, openai_model = (s["spec"]["predictor"]["model"] for s in (http_service, openai_service))
    assert openai_model["storageUri"] == http_model["storageUri"]
    assert openai_service["spec"]["predictor"]["canaryTrafficPercent"] == \
        http_service["spec"]["predictor"]["canaryTrafficPercent"]
    assert openai_model["env"] == http_model["env"] and openai_model["securityContext"] == http_model["securityContext"]
    http_runtime, runtime = (named(docs, "ServingRuntime", m["runtime"])["spec"]["containers"][0]
                             for m in (http_model, openai_model))
    assert _pushed(runtime["image"]) == f"{IMAGE}-llm"
    served = [str(ROOT / Path(a.split("=", 1)[1]).name) for a in runtime["args"] if a.startswith("--model-repository=")]
    assert serves_openai_model(served)
    # Knative routes the one port: the API's, which the keeper opens; Triton's HTTP stays on another, inside the pod.
    [routed] = runtime["ports"]
    assert f"--openai-port={routed['containerPort']}" in runtime["command"]
    assert f"--http-port={routed['containerPort']}" not in runtime["args"]
    assert runtime["readinessProbe"]["httpGet"] == {"path": "/v1/models", "port": routed["containerPort"]}
    # Restricted APIs and the admin key as on the HTTP runtime.
    restricted = [a for a in runtime["args"] if a.startswith(("--http-restricted-api=", "--grpc-restricted-protocol="))]
    assert sorted(restricted) == sorted(a for a in http_runtime["args"]
                                        if a.startswith(("--http-restricted-api=", "--grpc-restricted-protocol=")))
