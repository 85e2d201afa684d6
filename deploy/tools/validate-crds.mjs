// Validates custom resources (Prometheus Operator CRDs) against the schemas
// bundled in @kubernetes-models/prometheus-operator (see package.json here).
//
// Usage: node validate-crds.mjs NODE_MODULES_DIR < docs.json
// where docs.json is a JSON array of {file, doc} objects (validate_manifests.py
// turns YAML into that). Prints one line per document and exits 1 on failure.
//
// The bundled schemas check types, required fields, enums and patterns, but
// do not reject unknown fields: tests/test_deploy.py asserts the important
// ServiceMonitor fields directly.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";

const nodeModules = process.argv[2];
if (!nodeModules) {
  console.error("usage: node validate-crds.mjs NODE_MODULES_DIR < docs.json");
  process.exit(2);
}
const require = createRequire(join(nodeModules, "noop.js"));
const monitoringV1 = require("@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1");

const MODELS = {
  "monitoring.coreos.com/v1": {
    ServiceMonitor: monitoringV1.ServiceMonitor,
    PodMonitor: monitoringV1.PodMonitor,
    PrometheusRule: monitoringV1.PrometheusRule,
  },
};

const items = JSON.parse(readFileSync(0, "utf8"));
let failed = 0;
for (const { file, doc } of items) {
  const name = `${String(doc.kind).toLowerCase()}/${doc.metadata?.name}`;
  const Model = MODELS[doc.apiVersion]?.[doc.kind];
  if (!Model) {
    console.log(`ERROR ${file}: no bundled schema for ${doc.apiVersion} ${doc.kind}`);
    failed++;
    continue;
  }
  try {
    new Model(doc).validate();
    console.log(`OK    ${file}: ${name} (${doc.apiVersion}, bundled CRD schema)`);
  } catch (err) {
    console.log(`ERROR ${file}: ${name}: ${err.message}`);
    failed++;
  }
}
process.exit(failed ? 1 : 0);
