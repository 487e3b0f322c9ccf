//! The CSI Identity service and the kubelet registration service (what
//! node-driver-registrar serves beside a real driver).

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::json;
use tonic::{Request, Response, Status};

use volumed::csi::proto::csi_v1::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, ProbeRequest, ProbeResponse, identity_server::Identity,
};
use volumed::csi::proto::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
    registration_server::Registration,
};

use crate::driver::Driver;

/// The CSI versions GetInfo offers, as node-driver-registrar does.
const SUPPORTED_VERSIONS: &[&str] = &["1.0.0"];

/// The Identity service.
pub(crate) struct IdentityService(pub Arc<Driver>);

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        self.0
            .call(json!({"method": "GetPluginInfo"}), |d, _| {
                Ok(GetPluginInfoResponse {
                    name: d.name.clone(),
                    vendor_version: env!("CARGO_PKG_VERSION").to_owned(),
                    manifest: HashMap::new(),
                })
            })
            .await
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        // a node-only plugin: no CONTROLLER_SERVICE
        self.0
            .call(json!({"method": "GetPluginCapabilities"}), |_, _| {
                Ok(GetPluginCapabilitiesResponse::default())
            })
            .await
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        self.0
            .call(json!({"method": "Probe"}), |_, _| {
                Ok(ProbeResponse { ready: Some(true) })
            })
            .await
    }
}

/// The registration service on `<registration-dir>/<name>-reg.sock`.
pub(crate) struct RegistrationService(pub Arc<Driver>);

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        self.0
            .call(json!({"method": "GetInfo"}), |d, _| {
                Ok(PluginInfo {
                    r#type: "CSIPlugin".to_owned(),
                    name: d.name.clone(),
                    endpoint: d.endpoint.clone(),
                    supported_versions: SUPPORTED_VERSIONS
                        .iter()
                        .map(|v| (*v).to_owned())
                        .collect(),
                })
            })
            .await
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        let entry = json!({
            "method": "NotifyRegistrationStatus",
            "plugin_registered": status.plugin_registered,
            "error": status.error,
        });
        self.0
            .call(entry, |_, _| Ok(RegistrationStatusResponse {}))
            .await
    }
}
