-- Argo CD health check for serving.specdecode.io/v1alpha1 SpecDecodeService.
-- Install: the argocd-cm key resource.customizations.health.serving.specdecode.io_SpecDecodeService
-- (argocd-cm-patch.yaml beside this file carries it). Tested by tests/unit/test_argocd_health.py.
--
--   no status yet                               -> Progressing "Waiting for the operator"
--   status.observedGeneration < generation      -> Progressing (the operator has not seen the edit)
--   Degraded=True (or phase Degraded)           -> Degraded, with the condition's reason and message
--   Progressing=True (a rollout is under way)   -> Progressing
--   Ready=True and phase Serving                -> Healthy
--   scaled to zero (spec.replicas 0)            -> Healthy
--   Experimenting=True (a canary experiment)    -> as without it: the main Deployment keeps serving
--   anything else                               -> Progressing, saying what it waits for

local function find_condition(conditions, condition_type)
  if conditions == nil then
    return nil
  end
  for _, condition in ipairs(conditions) do
    if condition.type == condition_type then
      return condition
    end
  end
  return nil
end

local function is_true(condition)
  return condition ~= nil and condition.status == "True"
end

local function describe(condition, fallback)
  if condition == nil then
    return fallback
  end
  local reason = condition.reason
  local message = condition.message
  if message ~= nil and message ~= "" then
    if reason ~= nil and reason ~= "" then
      return reason .. ": " .. message
    end
    return message
  end
  if reason ~= nil and reason ~= "" then
    return reason
  end
  return fallback
end

local health = {}
local status = obj.status

if status == nil or (status.phase == nil and status.conditions == nil and status.observedGeneration == nil) then
  health.status = "Progressing"
  health.message = "Waiting for the operator"
  return health
end

local generation = nil
if obj.metadata ~= nil then
  generation = obj.metadata.generation
end
if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  health.status = "Progressing"
  health.message = string.format("Waiting for the operator to observe generation %d", generation)
  return health
end

local conditions = status.conditions
local degraded = find_condition(conditions, "Degraded")
if is_true(degraded) then
  health.status = "Degraded"
  health.message = describe(degraded, "Degraded")
  return health
end
if status.phase == "Degraded" then
  health.status = "Degraded"
  health.message = describe(degraded, "The operator reports phase Degraded")
  return health
end

local progressing = find_condition(conditions, "Progressing")
if is_true(progressing) then
  health.status = "Progressing"
  health.message = describe(progressing, "Rolling out")
  return health
end

local ready = find_condition(conditions, "Ready")
if is_true(ready) and status.phase == "Serving" then
  health.status = "Healthy"
  health.message = describe(ready, "Serving")
  return health
end
if ready ~= nil and ready.reason == "ScaledToZero" then
  health.status = "Healthy"
  health.message = "Scaled to zero replicas"
  return health
end

health.status = "Progressing"
local phase = status.phase
if phase == nil then
  phase = "unknown"
end
health.message = "Waiting for the service to become ready (phase " .. phase .. "): " .. describe(ready, "no Ready condition yet")
return health
