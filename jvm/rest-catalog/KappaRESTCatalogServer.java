/*
 * Apache Iceberg's REST catalog test server (org.apache.iceberg.rest.RESTCatalogServer, what the
 * apache/iceberg-rest-fixture image runs), bound to one address instead of every interface.
 *
 * Upstream's start() listens on all interfaces (new Server(port)); the tests' servers bind 127.0.0.1
 * only. This launcher builds the same backend catalog (upstream's own initializeBackendCatalog: the
 * CATALOG_* environment variables, a JdbcCatalog by default) and the same adapter and servlet, and
 * serves them on REST_HOST (default 127.0.0.1) and the port of CATALOG_REST_PORT (default 8181).
 * It lives in upstream's package because the adapter and the catalog context are package-private.
 * Compiled by jvm/fetch.sh into <cache>/rest-catalog/kappa-rest-catalog.jar; it prints
 * "KAPPA_REST_CATALOG_READY <port>" once it serves.
 */
package org.apache.iceberg.rest;

import java.lang.reflect.Method;
import org.eclipse.jetty.ee10.servlet.ServletContextHandler;
import org.eclipse.jetty.ee10.servlet.ServletHolder;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;

public final class KappaRESTCatalogServer {
  private KappaRESTCatalogServer() {}

  public static void main(String[] args) throws Exception {
    String host = System.getenv().getOrDefault("REST_HOST", "127.0.0.1");
    RESTCatalogServer upstream = new RESTCatalogServer();
    // upstream's private catalog set-up, so the catalog is exactly the one its main() serves
    Method init = RESTCatalogServer.class.getDeclaredMethod("initializeBackendCatalog");
    init.setAccessible(true);
    RESTCatalogServer.CatalogContext context = (RESTCatalogServer.CatalogContext) init.invoke(upstream);
    int port = Integer.parseInt(context.configuration().getOrDefault(RESTCatalogServer.REST_PORT, "8181"));

    ServletContextHandler handler = new ServletContextHandler(ServletContextHandler.NO_SESSIONS);
    handler.addServlet(new ServletHolder(new RESTCatalogServlet(new RESTServerCatalogAdapter(context))), "/*");
    Server server = new Server();
    ServerConnector connector = new ServerConnector(server);
    connector.setHost(host);
    connector.setPort(port);
    server.addConnector(connector);
    server.setHandler(handler);
    server.start();
    System.out.println("KAPPA_REST_CATALOG_READY " + connector.getLocalPort());
    System.out.flush();
    server.join();
  }
}
